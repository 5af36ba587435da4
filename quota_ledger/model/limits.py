"""Which limits a request breaks: pure arithmetic over locked counter snapshots."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from quota_ledger.model.errors import CounterOverflow
from quota_ledger.model.quantity import MAX_QUANTITY
from quota_ledger.model.values import Violation

#: usage charged to exactly one queue; never carries a limit
QUEUE = "queue"
#: usage of a queue and all its descendants; exists only where a limit is set
SUBTREE = "subtree"


@dataclass(frozen=True, slots=True)
class Counter:
    """A snapshot of one ``quota_usages`` row, read under its row lock."""

    id: int
    scope_type: str
    scope: str
    resource: str
    in_use: int
    reserved: int
    limit: int | None
    #: the user or group of a ``user``/``group`` counter (``quota_identity_usages``)
    name: str | None = None


def violations(partition: str, requested: Mapping[str, int], counters: Iterable[Counter]) -> list[Violation]:
    """Every limit that ``in_use + reserved + requested <= limit`` would break, in scope order."""
    found = []
    for counter in counters:
        amount = requested.get(counter.resource, 0)
        if counter.limit is None or amount == 0:
            continue
        if counter.in_use + counter.reserved + amount > counter.limit:
            found.append(
                Violation(
                    partition=partition,
                    scope=counter.scope,
                    resource=counter.resource,
                    limit=counter.limit,
                    in_use=counter.in_use,
                    reserved=counter.reserved,
                    requested=amount,
                    kind=counter.scope_type if counter.name is not None else "queue",
                    name=counter.name,
                )
            )
    return found


def check_overflow(
    deltas: Mapping[str, int], counters: Iterable[Counter], *, field: str = "reserved"
) -> None:
    """Refuse a change that would push a counter past the BIGINT range (lesson: Cinder 2137642)."""
    for counter in counters:
        current = counter.reserved if field == "reserved" else counter.in_use
        if current + deltas.get(counter.resource, 0) > MAX_QUANTITY:
            raise CounterOverflow(counter.scope, counter.resource)
