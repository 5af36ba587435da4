"""A full list of pods against what the ledger holds: which pods to charge, which reservations to
release. Pure.

After a relist is acted on, the ledger agrees with the cluster: every pod that exists and has not
ended is charged (its pending reservation committed, or charged outright when the webhook never
saw it), and every committed reservation whose pod is gone or ended is released. A pending
reservation without a pod is kept here: its pod may be on its way to being stored (the webhook
admits before the API server stores); :class:`~quota_ledger.reconciler.pods.PodSync` rolls it
back once it is older than its grace.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from quota_ledger.engine.reservations import RECHARGED
from quota_ledger.model.values import ReservationState
from quota_ledger.reconciler import decision
from quota_ledger.reconciler.decision import Held

#: a pod's uid, as the API server makes them (RFC 4122, lower case)
_UID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def uid_of_key(key: str) -> str:
    """The pod uid a reservation key stands for (a pod charged again has a second key)."""
    return key.removesuffix(RECHARGED)


def is_pod_key(key: str) -> bool:
    """Whether a reservation key is a pod's (its uid, or the second key of a pod charged
    again): other keyed reservations of the partition are not the reconciler's to release."""
    return _UID.fullmatch(uid_of_key(key)) is not None


@dataclass(frozen=True, kw_only=True)
class Diff:
    """What a relist asks of the ledger."""

    #: pods to charge (the ledger holds no committed reservation for them)
    charge: list[Mapping[str, Any]] = field(default_factory=list)
    #: (pod uid, reservation id) of reservations to release: their pods are gone or ended
    release: list[tuple[str, str]] = field(default_factory=list)
    #: pod uid -> what the ledger holds once the diff is acted on
    held: dict[str, Held] = field(default_factory=dict)
    #: reservation ids by pod uid, for the reservations still held afterwards
    ids: dict[str, str] = field(default_factory=dict)


def diff(pods: Iterable[Mapping[str, Any]], held: Mapping[str, tuple[str, ReservationState]]) -> Diff:
    """Compare the pods that exist with ``held`` (:meth:`QuotaEngine.held_keys`: key ->
    (reservation id, state) of the keyed reservations still holding something); only pods'
    keys (:func:`is_pod_key`) count."""
    by_uid = {uid_of_key(k): v for k, v in held.items() if is_pod_key(k)}
    found = Diff()
    seen: set[str] = set()
    for pod in pods:
        uid = decision.uid(pod)
        if uid is None:
            continue
        seen.add(uid)
        rid, state = by_uid.get(uid, ("", None))
        now = Held.UNKNOWN if state is None else _held(state)
        action = decision.decide("ADDED", pod, now)
        if action is decision.Action.CHARGE:
            found.charge.append(pod)
        elif action is decision.Action.RELEASE:
            if state is not None:
                found.release.append((uid, rid))
            found.held[uid] = Held.RELEASED
        else:
            found.held[uid] = now
            found.ids[uid] = rid
    for uid, (rid, state) in by_uid.items():
        if uid in seen:
            continue
        if state is ReservationState.COMMITTED:
            found.release.append((uid, rid))
        else:  # pending without a pod: it may be stored yet, or it expires
            found.held[uid] = Held.PENDING
            found.ids[uid] = rid
    return found


def _held(state: ReservationState) -> Held:
    return Held.PENDING if state is ReservationState.PENDING else Held.CHARGED
