"""The ledger's side of pods: each event decided (:mod:`~quota_ledger.reconciler.decision`) and
done, each relist diffed (:mod:`~quota_ledger.reconciler.relist`) and done, overruns counted
and logged.

What the ledger holds for each pod is remembered between events (refreshed by every relist), so
that a pod's many MODIFIED events cost the database nothing once it is charged.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from quota_ledger.engine import QuotaEngine
from quota_ledger.engine.reservations import recharge_key
from quota_ledger.model.errors import (
    DatabaseUnavailable,
    QuotaLedgerError,
    ReservationNotFound,
    SchemaNotReady,
)
from quota_ledger.model.values import Charged, ReservationState, Violation
from quota_ledger.reconciler import decision, relist
from quota_ledger.reconciler.decision import Action, Held
from quota_ledger.reconciler.metrics import Metrics

log = logging.getLogger("quota_ledger.reconciler")


class PodSync:
    """Keeps the ledger's reservations in line with the pods that exist."""

    def __init__(
        self, engine: QuotaEngine, metrics: Metrics, *, partition: str, pending_grace: float = 60.0
    ) -> None:
        self.engine = engine
        self.metrics = metrics
        self.partition = partition
        #: a pending reservation this much older than a list without its pod is rolled back
        self.pending_grace = timedelta(seconds=pending_grace)
        #: pod uid -> what the ledger holds for it
        self.held: dict[str, Held] = {}
        #: pod uid -> the id of its reservation, where known
        self.ids: dict[str, str] = {}

    def relisted(self, items: list[dict[str, Any]], listed_at: datetime) -> None:
        """Charge every live pod the ledger does not hold, release what gone pods hold, and roll
        back the pending reservations of pods the list lacks that were made more than
        ``pending_grace`` before it began: their pods were never stored, or were deleted unseen
        (history lost to 410 Gone), since a pod is stored moments after its admission."""
        found = relist.diff(items, self.engine.held_keys(partition=self.partition))
        self.held, self.ids = found.held, found.ids
        for uid, reservation_id in found.release:
            self._release_id(uid, reservation_id)
        for pod in found.charge:
            self._charge(pod)
        waiting = [(uid, rid) for uid, rid in found.ids.items() if found.held.get(uid) is Held.PENDING]
        for uid, reservation_id in waiting:
            try:
                made = self.engine.get(reservation_id)
            except ReservationNotFound:
                continue
            if made.state is ReservationState.PENDING and made.created_at < listed_at - self.pending_grace:
                self._release_id(uid, reservation_id)
                self.metrics.abandoned.inc()

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        """One watch event of a pod."""
        uid = decision.uid(obj)
        if uid is None:
            return
        action = decision.decide(kind, obj, self.held.get(uid, Held.UNKNOWN))
        if action is Action.CHARGE:
            self._charge(obj)
        elif action is Action.RELEASE:
            self._release(uid)
        if kind == "DELETED":
            # a uid is never used again: forget it, so that memory follows the live pods
            self.held.pop(uid, None)
            self.ids.pop(uid, None)

    def _charge(self, pod: Mapping[str, Any]) -> None:
        uid = decision.uid(pod)
        assert uid is not None
        try:
            done = self.engine.charge_pod(dict(pod), partition=self.partition)
        except (DatabaseUnavailable, SchemaNotReady):
            raise  # the loop relists once the database is back
        except QuotaLedgerError as error:  # a pod the ledger refuses to read: counted, not retried
            log.warning("reconciler: pod %s not charged: %s", _name(pod), error)
            self.metrics.errors.labels("pod").inc()
            self.held[uid] = Held.RELEASED
            return
        self.held[uid] = Held.CHARGED
        self.ids[uid] = done.reservation.id
        if done.how is Charged.COMMITTED:
            self.metrics.committed.inc()
        elif done.how is Charged.CHARGED:
            self.metrics.charged.inc()
            log.info("reconciler: pod %s charged (the ledger had no reservation for it)", _name(pod))
        for violation in done.overruns:
            self._overrun(pod, violation)

    def _overrun(self, pod: Mapping[str, Any], violation: Violation) -> None:
        self.metrics.overruns.labels(violation.kind).inc()
        log.warning(
            "reconciler: overrun: pod %s charged over %s %s: %s limit %d, in use %d, reserved %d, "
            "requested %d",
            _name(pod),
            violation.kind,
            violation.name or violation.scope,
            violation.resource,
            violation.limit,
            violation.in_use,
            violation.reserved,
            violation.requested,
        )

    def _release(self, uid: str) -> None:
        reservation_id = self.ids.get(uid)
        if reservation_id is None:
            for key in (uid, recharge_key(uid)):
                try:
                    found = self.engine.get_by_key(key, partition=self.partition)
                except ReservationNotFound:
                    continue
                if found.state is ReservationState.PENDING or (
                    found.state is ReservationState.COMMITTED and found.released_at is None
                ):
                    reservation_id = found.id
        if reservation_id is not None:
            self._release_id(uid, reservation_id)
        self.held[uid] = Held.RELEASED
        self.ids.pop(uid, None)

    def _release_id(self, uid: str, reservation_id: str) -> None:
        self.held[uid] = Held.RELEASED
        try:
            done = self.engine.release_reservation(reservation_id)
        except (DatabaseUnavailable, SchemaNotReady):
            raise
        except QuotaLedgerError as error:  # the ledger disagrees with itself: the audit says more
            log.warning("reconciler: reservation %s of pod %s not released: %s", reservation_id, uid, error)
            self.metrics.errors.labels("pod").inc()
            return
        if done.state is ReservationState.COMMITTED:
            self.metrics.released.inc()


def _name(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"
