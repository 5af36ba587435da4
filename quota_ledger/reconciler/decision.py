"""What one pod, as the API server shows it, asks of the ledger. Pure.

A pod counts from the moment it is stored until it is deleted or ends, as Kubernetes' own quota
counts it (from creation, not from binding): the reconciler charges a pod on first sight of it
stored, bound to a node or not, which commits the pending reservation the admission webhook made
for it (or charges it outright when the ledger has none). It releases the pod when it is deleted
or reaches a terminal phase (``Succeeded``, ``Failed``); a DELETE admission review is never a
release, since the deletion may yet fail.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

#: the phases after which a pod holds nothing (its containers will not run again)
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


class Held(enum.Enum):
    """What the ledger holds for one pod, as far as the reconciler knows."""

    #: nothing known: never charged, or not looked up yet
    UNKNOWN = "unknown"
    #: a pending reservation (admitted, not yet seen stored)
    PENDING = "pending"
    #: a committed reservation, not released
    CHARGED = "charged"
    #: released (or ended): nothing more to do for this pod
    RELEASED = "released"


class Action(enum.Enum):
    """What to do to the ledger for a pod."""

    #: commit its pending reservation, or charge it when there is none
    CHARGE = "charge"
    #: release what it holds (a pending reservation is rolled back)
    RELEASE = "release"
    NOTHING = "nothing"


def uid(pod: Mapping[str, Any]) -> str | None:
    """The pod's ``metadata.uid``, the key of its reservation."""
    found = (pod.get("metadata") or {}).get("uid")
    return found if isinstance(found, str) and found else None


def finished(pod: Mapping[str, Any]) -> bool:
    """Whether the pod reached a terminal phase."""
    return (pod.get("status") or {}).get("phase") in TERMINAL_PHASES


def decide(event: str, pod: Mapping[str, Any], held: Held) -> Action:
    """The action for a watch event (``ADDED``, ``MODIFIED``, ``DELETED``; a listed pod is
    ``ADDED``) of ``pod``, given what the ledger holds for it."""
    if uid(pod) is None:
        return Action.NOTHING
    if event == "DELETED" or finished(pod):
        return Action.RELEASE if held in (Held.PENDING, Held.CHARGED, Held.UNKNOWN) else Action.NOTHING
    return Action.CHARGE if held in (Held.UNKNOWN, Held.PENDING) else Action.NOTHING
