"""What a token restricted to a queue subtree is told about the rest of its partition: nothing.

Two answers of the ledger would otherwise speak of reservations and usage outside the subtree:

- **Idempotency keys** are unique per partition (the table's unique index, and the Python API's
  promise). A reserve whose key is held by a reservation outside the token's subtree is
  therefore made under a *scoped key* instead, ``key + "~" + tag``, where the tag is a hash of
  the partition, the token's queue and the key: the token gets 201, as for a key never used, and
  a retry under the same key finds the scoped key's reservation again. The token is always
  shown the key it sent (:func:`shown`), and ``GET /v1/reservations?key=`` looks the scoped key
  up too (:func:`scoped_key`). Tokens restricted to no queue and the Python API see the stored key.
- **Refusals** (:class:`ScopedOverQuota`): a broken limit of a queue outside the subtree (an
  ancestor's, or a user's or group's limit set there) is reported with its scope, resource,
  limit, the amount requested and the shortfall, but without that queue's usage.

A release key of such a token is always made its own (:func:`release_key`): release keys are
stored nowhere a caller reads, so no one is shown the difference.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from typing import Any

from quota_ledger.model import queues, validation
from quota_ledger.model.errors import InvalidRequest, OverQuota
from quota_ledger.model.quantity import format_human
from quota_ledger.model.values import Reservation, Violation
from quota_ledger.runtime.tokens import Token

#: between a key and its tag in a scoped key
SEPARATOR = "~"
_TAG_LENGTH = 16
#: the longest key that has a scoped form; a longer one held outside the subtree is a conflict
MAX_SCOPED_KEY = validation.MAX_NAME_LENGTH - len(SEPARATOR) - _TAG_LENGTH


def _tag(partition: str, queue: str, key: str) -> str:
    text = f"{partition}\x00{queue}\x00{key}"
    return hashlib.sha256(text.encode()).hexdigest()[:_TAG_LENGTH]


def scoped_key(token: Token, partition: str, key: str) -> str | None:
    """The key a reservation of ``token`` is stored under when ``key`` is held outside the
    token's subtree; None for a token restricted to no queue (it sees every holder) or a key
    longer than :data:`MAX_SCOPED_KEY`."""
    if token.queue is None or len(key) > MAX_SCOPED_KEY:
        return None
    return f"{key}{SEPARATOR}{_tag(partition, token.queue, key)}"


def release_key(token: Token, partition: str, key: object) -> object:
    """The key a release of ``token`` is made under: for a token restricted to a queue, always
    its own (a hash of the partition, the token's queue and the key), so that a key used by a
    release outside the subtree never conflicts. A release key is stored nowhere a caller or a
    DBA reads (it names the release's operation in the journal, as a UUID), so no one is shown
    the difference. A key that is not a valid name is passed on, for the engine to refuse."""
    if token.queue is None or key is None:
        return key
    try:
        name = validation.name(key, "key")
    except InvalidRequest:
        return key
    text = f"release\x00{partition}\x00{token.queue}\x00{name}"
    return SEPARATOR + hashlib.sha256(text.encode()).hexdigest()


def sent_key(reservation: Reservation) -> str | None:
    """The key the caller sent, when ``reservation`` is stored under a scoped key made for a
    token restricted to its queue or an ancestor; else None."""
    key = reservation.key
    if key is None or len(key) <= _TAG_LENGTH + len(SEPARATOR):
        return None
    sent, separator, tag = key[: -_TAG_LENGTH - 1], key[-_TAG_LENGTH - 1], key[-_TAG_LENGTH:]
    if separator != SEPARATOR:
        return None
    for queue in queues.lineage(reservation.queue):
        if _tag(reservation.partition, queue, sent) == tag:
            return sent
    return None


def shown(token: Token, reservation: Reservation) -> Reservation:
    """``reservation`` as ``token`` sees it: a token restricted to a queue sees the key it sent,
    never its scoped form (which would tell that the key is held elsewhere)."""
    if token.queue is None or (sent := sent_key(reservation)) is None:
        return reservation
    return dataclasses.replace(reservation, key=sent)


def outside(token: Token, violation: Violation) -> bool:
    """Whether the broken limit is one of a queue outside the token's subtree. A ResourceQuota's
    usage is its namespace's, all in the namespace's queue, which the request lay in."""
    return violation.kind != "quota" and not token.covers(violation.partition, violation.scope)


def shortfall(violation: Violation) -> int:
    """How much less the request would have to ask for to fit this limit."""
    return violation.requested - violation.available


class ScopedOverQuota(OverQuota):
    """The request would exceed one or more limits; nothing was reserved."""

    def __init__(self, violations: Sequence[Violation], hidden: Sequence[bool]) -> None:
        super().__init__(violations)
        #: per violation: whether its usage is hidden (a queue outside the token's subtree)
        self.hidden = tuple(hidden)
        shown = zip(violations, self.hidden, strict=True)
        parts = "; ".join(describe(v, hide) for v, hide in shown)
        self.args = (f"over quota: {parts}",)


def describe(violation: Violation, hidden: bool) -> str:
    """One line of a refusal: without the limit's usage when ``hidden``."""
    return _describe_hidden(violation) if hidden else violation.describe()


def _describe_hidden(violation: Violation) -> str:
    who = f" for {violation.kind} {violation.name}" if violation.name is not None else ""

    def human(units: int) -> str:
        return format_human(violation.resource, units)

    return (
        f"{violation.resource} at {violation.scope}{who}: limit {human(violation.limit)}, "
        f"requested {human(violation.requested)}, over by {human(shortfall(violation))}"
    )


def refusal(token: Token, error: Exception) -> Exception:
    """The refusal ``token`` is shown: an :class:`OverQuota` at a queue outside its subtree
    becomes a :class:`ScopedOverQuota`; any other error is shown as it is."""
    if not isinstance(error, OverQuota) or isinstance(error, ScopedOverQuota) or token.queue is None:
        return error
    hidden = [outside(token, v) for v in error.violations]
    if not any(hidden):
        return error
    return ScopedOverQuota(error.violations, hidden)


def violation_body(violation: Violation, hidden: bool) -> dict[str, Any]:
    """A violation in a 409 body: every field, and ``shortfall``; ``in_use`` and ``reserved``
    are null when ``hidden``."""
    found = dataclasses.asdict(violation)
    found["shortfall"] = shortfall(violation)
    if hidden:
        found["in_use"] = found["reserved"] = None
    return found


def violations_body(error: OverQuota) -> list[dict[str, Any]]:
    """The violations of a 409 ``over_quota`` body, each with its ``shortfall``."""
    hidden = error.hidden if isinstance(error, ScopedOverQuota) else (False,) * len(error.violations)
    return [violation_body(v, h) for v, h in zip(error.violations, hidden, strict=True)]
