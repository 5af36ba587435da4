"""The ledger's rule: which requests are admitted, and what each one changes on its counters.

Pure: no I/O. Every operation that changes usage (reserve, commit whole or in part, rollback,
release, expiry, charging a pod that already runs) states each of its requests as an
:class:`Ask`: the locked counters it charges, each with what it adds to ``in_use`` and to
``reserved`` (negative to give back). :func:`decide` takes a batch of asks in order, each seeing
what the asks admitted before it added, and returns a :class:`Decision` for each: admitted, or
refused with every limit it would break and the counter it would push past the bigint range.
A single request is a batch of one.

The rule is the one the ledger has always had (OpenStack's ``available = limit - (in_use +
reserved)``): an ask that grows a limited counter's ``in_use + reserved`` past its limit breaks
that limit; equality is allowed. A counter without a limit, or a charge that does not grow it,
is never broken. An ask that is not :attr:`Ask.enforced` (charging what already runs, giving
back what was held) is admitted with the limits it breaks listed, but never past the bigint
range.

The builders below (:func:`reserving`, :func:`resolving`, :func:`releasing`) say what each
operation charges to each kind of counter; the operations lock the counters and apply the
decided :attr:`Decision.deltas`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from quota_ledger.model.counters import QUEUE, QUOTA, SUBTREE, Counter
from quota_ledger.model.errors import CounterOverflow, OverQuota, QuotaLedgerError
from quota_ledger.model.quantity import APPLICATIONS, MAX_QUANTITY
from quota_ledger.model.values import Violation

#: the table a counter lives in: ``quota_usages`` (queue and subtree counters) or
#: ``quota_identity_usages`` (user, group and ResourceQuota counters)
Table = Literal["usages", "identity"]
#: a counter's key across both tables
CounterKey = tuple[Table, int]


def table(counter: Counter) -> Table:
    return "usages" if counter.scope_type in (QUEUE, SUBTREE) else "identity"


def key(counter: Counter) -> CounterKey:
    return table(counter), counter.id


@dataclass(frozen=True, slots=True)
class Charge:
    """What one ask adds to one locked counter."""

    counter: Counter
    in_use: int = 0
    reserved: int = 0


@dataclass(frozen=True, slots=True)
class Ask:
    """One request of a batch: the counters it charges, in the order its violations are listed."""

    partition: str
    charges: Sequence[Charge]
    #: False: a limit it breaks is listed, not refused
    enforced: bool = True


@dataclass(frozen=True, slots=True)
class Decision:
    """What :func:`decide` decided for one ask."""

    #: every limit it would break (refused when enforced)
    violations: tuple[Violation, ...] = ()
    #: (scope, resource) of a counter it would push past the bigint range (always refused)
    overflow: tuple[str, str] | None = None
    enforced: bool = True
    #: counter -> (in_use, reserved) it adds, when admitted (empty when refused)
    deltas: Mapping[CounterKey, tuple[int, int]] = field(default_factory=dict)

    @property
    def admitted(self) -> bool:
        return self.overflow is None and not (self.enforced and self.violations)

    def refusal(self) -> QuotaLedgerError | None:
        """The error a refused ask raises: :class:`OverQuota` with every broken limit, else
        :class:`CounterOverflow`; None when admitted."""
        if self.enforced and self.violations:
            return OverQuota(list(self.violations))
        if self.overflow is not None:
            return CounterOverflow(*self.overflow)
        return None

    def admit(self) -> Decision:
        """This decision, or raise its refusal."""
        if (error := self.refusal()) is not None:
            raise error
        return self


def decide(asks: Sequence[Ask]) -> list[Decision]:
    """Decide ``asks`` in order, each against its counters as the asks admitted before it left
    them; a decision for each."""
    added: dict[CounterKey, tuple[int, int]] = {}
    decisions = []
    for ask in asks:
        decision = _one(ask, added)
        for counter_key, (in_use, reserved) in decision.deltas.items():
            was = added.get(counter_key, (0, 0))
            added[counter_key] = (was[0] + in_use, was[1] + reserved)
        decisions.append(decision)
    return decisions


def decide_one(ask: Ask) -> Decision:
    """A batch of one."""
    return _one(ask, {})


def _one(ask: Ask, added: Mapping[CounterKey, tuple[int, int]]) -> Decision:
    deltas: dict[CounterKey, tuple[int, int]] = {}
    violations: list[Violation] = []
    overflow: tuple[str, str] | None = None
    for charge in ask.charges:
        counter = charge.counter
        counter_key = key(counter)
        before = added.get(counter_key, (0, 0))
        mine = deltas.get(counter_key, (0, 0))
        in_use = counter.in_use + before[0] + mine[0]
        reserved = counter.reserved + before[1] + mine[1]
        growth = charge.in_use + charge.reserved
        if counter.limit is not None and growth > 0 and in_use + reserved + growth > counter.limit:
            violations.append(_violation(ask.partition, counter, in_use, reserved, growth))
        if overflow is None and (
            (charge.in_use > 0 and in_use + charge.in_use > MAX_QUANTITY)
            or (charge.reserved > 0 and reserved + charge.reserved > MAX_QUANTITY)
        ):
            overflow = (counter.scope, counter.resource)
        deltas[counter_key] = (mine[0] + charge.in_use, mine[1] + charge.reserved)
    decision = Decision(tuple(violations), overflow, ask.enforced)
    if not decision.admitted:
        return decision
    return Decision(decision.violations, None, ask.enforced, deltas)


def _violation(partition: str, counter: Counter, in_use: int, reserved: int, requested: int) -> Violation:
    assert counter.limit is not None
    quota = counter.scope_type == QUOTA
    return Violation(
        partition=partition,
        # a ResourceQuota is named by namespace/name, the scope of its violation
        scope=counter.name if quota and counter.name is not None else counter.scope,
        resource=counter.resource,
        limit=counter.limit,
        in_use=in_use,
        reserved=reserved,
        requested=requested,
        kind=counter.scope_type if counter.name is not None else "queue",
        name=counter.name,
    )


# -- what each operation charges ----------------------------------------------------------------
def reserving(
    counters: Iterable[Counter], requested: Mapping[str, int], quota_usage: Mapping[str, int] | None = None
) -> list[Charge]:
    """A reserve: its resources are reserved; a running-application count (a new application's
    ``applications: 1``) and a ResourceQuota's usage (Kubernetes counts it as used) are in use
    at once."""
    found = []
    for counter in counters:
        if counter.scope_type == QUOTA:
            found.append(Charge(counter, in_use=(quota_usage or {})[counter.resource]))
        elif counter.resource == APPLICATIONS:
            found.append(Charge(counter, in_use=requested[APPLICATIONS]))
        else:
            found.append(Charge(counter, reserved=requested[counter.resource]))
    return found


def resolving(
    counters: Iterable[Counter],
    reserved: Mapping[str, int],
    committed: Mapping[str, int],
    *,
    stopped: bool = False,
) -> list[Charge]:
    """A pending reservation resolved: what it reserved is given back and what it commits is in
    use (a rollback or an expiry commits nothing); its application, when it stops running,
    leaves the running-application counts."""
    found = []
    for counter in counters:
        if counter.resource == APPLICATIONS:
            if stopped:
                found.append(Charge(counter, in_use=-1))
        else:
            found.append(
                Charge(
                    counter, in_use=committed.get(counter.resource, 0), reserved=-reserved[counter.resource]
                )
            )
    return found


def releasing(
    counters: Iterable[Counter], amounts: Mapping[str, int], *, stopped: bool = False
) -> list[Charge]:
    """In-use resources given back (and, when the application stops, its running count)."""
    found = []
    for counter in counters:
        if counter.resource == APPLICATIONS:
            if stopped:
                found.append(Charge(counter, in_use=-1))
        else:
            found.append(Charge(counter, in_use=-amounts[counter.resource]))
    return found


def leaving_quotas(counters: Iterable[Counter], usage: Mapping[str, int]) -> list[Charge]:
    """A reservation that leaves the ResourceQuotas counting it (``counters``) without being
    committed: its usage is no longer in use there."""
    return [Charge(c, in_use=-usage[c.resource]) for c in counters]


def split(
    deltas: Mapping[CounterKey, tuple[int, int]],
) -> tuple[dict[int, tuple[int, int]], dict[int, tuple[int, int]]]:
    """``deltas`` by table: (``quota_usages`` ids, ``quota_identity_usages`` ids)."""
    usages: dict[int, tuple[int, int]] = {}
    identity: dict[int, tuple[int, int]] = {}
    for (where, counter_id), delta in deltas.items():
        (usages if where == "usages" else identity)[counter_id] = delta
    return usages, identity


def summed(decisions: Iterable[Decision]) -> dict[CounterKey, tuple[int, int]]:
    """The deltas of the admitted ``decisions``, summed per counter."""
    total: dict[CounterKey, tuple[int, int]] = {}
    for decision in decisions:
        for counter_key, (in_use, reserved) in decision.deltas.items():
            was = total.get(counter_key, (0, 0))
            total[counter_key] = (was[0] + in_use, was[1] + reserved)
    return total
