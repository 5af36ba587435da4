"""Reserve: the rule's path, for a request alone or a batch's set of them, on every backend.

:func:`decide` reserves what can be reserved of a list of requests of one partition as they
would be reserved one after another, in order, under the shared partition lock and the rules in
force, in the lock order of :mod:`quota_ledger.driver.tx`:

- the members' application rows are locked, opened in memory one after another and written
  (:mod:`.reserve_tracking`);
- the queues' own counters are locked, the missing ones (first uses) inserted and locked;
- the subtree counters of the members' lineages are locked, ``applications`` too where a
  member starts its application;
- the user/group counters that enforce the members are locked, the missing ones (a user's
  copies of a wildcard limit, a new group's) created from the application rows first, then the
  ResourceQuota counters that count them;
- the rule (:mod:`quota_ledger.model.charges`) admits or refuses each member in order, each
  seeing what those admitted before it added; the reservations admitted are inserted and every
  counter is updated once with the sum.

A request alone (:func:`general`, the step of every reserve) is a set of one. It writes its
reservation row first, right after the partition lock, so that a concurrent request with the
same idempotency key waits on that row and then finds it; a set's members have no keys (group
commit decides keyed requests alone), and their rows are inserted with the sums.

A member the rule refuses leaves no trace: where it left a row of its own (its application row,
a counter only it needed), the set goes back to a savepoint taken before its first write and
decides again with the admitted ones only, which admits them again. A request alone is refused
by raising, which rolls its transaction back.

A set of many leaves to its members' own call (a set of one, which decides everything): one
naming a resource no counter of the partition names yet (alone, it checks the partition's bound
of names), and every member when the second pass does not admit what the first did.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial

from quota_ledger.config import typos
from quota_ledger.config.identity import Key
from quota_ledger.config.rules import PartitionRules
from quota_ledger.driver.tx import LedgerTx, Undo
from quota_ledger.kube.quotas import ResourceQuota
from quota_ledger.ledger import reserve_tracking, resource_quotas
from quota_ledger.ledger.compiled import CompiledRules
from quota_ledger.ledger.group_decision import Refused, Together
from quota_ledger.model import arguments, charges, line, queues, validation
from quota_ledger.model.counters import Counter
from quota_ledger.model.errors import InvalidRequest, OverQuota, QuotaLedgerError
from quota_ledger.model.requests import ReserveRequest
from quota_ledger.model.values import Reservation, Violation

#: what :func:`decide` says of a request: its reservation, or its refusal
Outcome = Reservation | Refused


def refusal(rules: PartitionRules, request: ReserveRequest) -> InvalidRequest | None:
    """The error of a request naming what its partition's configuration does not know, where
    the partition refuses such names (:mod:`quota_ledger.config.typos`); None otherwise."""
    if not request.checks_names or not rules.refuses_unknown_names:
        return None
    return typos.in_request(rules, request.queue, request.resources).refusal()


def general(
    tx: LedgerTx,
    rules: CompiledRules,
    bounds: validation.Bounds,
    request: ReserveRequest,
    overruns: list[Violation] | None = None,
) -> Reservation:
    """Reserve ``request`` alone: a set of one; raises its refusal.

    With ``overruns`` nothing is refused for a limit: the limits it breaks are appended to that
    list instead (charging what already runs, :meth:`QuotaEngine.charge_pod`)."""
    outcome = decide(tx, [request], rules=rules, bounds=bounds, overruns=overruns)[0]
    if isinstance(outcome, Refused):
        raise outcome.error
    return outcome


def grant(
    tx: LedgerTx, rules: CompiledRules, bounds: validation.Bounds, request: ReserveRequest, undo: Undo
) -> tuple[Reservation, bool | None]:
    """Grant a waiting ``request`` (``request.granting``; its row locked by the caller) as a
    reserve alone would decide it; raises its refusal. ``undo``'s savepoint is taken before the
    first write that is not the grant's own, if any (a first use's counter): a refusal goes back
    to it. Returns the reservation, and whether the same request again would be admitted now,
    after it (None: not known, for a tracked request, whose first one may start its application)."""
    room: list[bool | None] = []
    outcome = decide(tx, [request], rules=rules, bounds=bounds, undo=undo, room=room)[0]
    if isinstance(outcome, Refused):
        raise outcome.error
    return outcome, room[0] if room else None


def together(
    rules: CompiledRules, bounds: validation.Bounds, request: ReserveRequest
) -> Together[Reservation] | None:
    """How group commit decides ``request`` with the other keyless ones of its partition
    (None: it has a key, and is decided alone)."""
    if request.key is not None:
        return None
    return Together(("reserve", request.partition), request, partial(decide, rules=rules, bounds=bounds))


def decide(
    tx: LedgerTx,
    requests: Sequence[ReserveRequest],
    *,
    rules: CompiledRules,
    bounds: validation.Bounds,
    overruns: list[Violation] | None = None,
    undo: Undo | None = None,
    room: list[bool | None] | None = None,
) -> dict[int, Outcome]:
    """Reserve what can be reserved of ``requests`` (of one partition) as they would be one
    after another; the outcome of each request decided, by its place (a request alone is
    always decided). ``overruns``: see :func:`general`; ``undo`` and ``room``: see
    :func:`grant` (a request alone only)."""
    alone = len(requests) == 1
    outcomes: dict[int, Outcome] = {}
    fresh: list[tuple[int, ReserveRequest]] = []
    for n, request in enumerate(requests):
        try:
            found = None if request.granting else made_before(tx, request)
        except QuotaLedgerError as error:
            outcomes[n] = Refused(error)
            continue
        if found is not None:
            outcomes[n] = found
        else:
            fresh.append((n, request))
    if not fresh:
        return outcomes
    partition = requests[0].partition
    now = tx.lock_partition(partition, exclusive=False)
    in_force = rules.partition(tx, partition)
    candidates: list[_Candidate] = []
    for n, request in fresh:
        try:
            quotas = _quotas(in_force, request, charging=overruns is not None)
        except QuotaLedgerError as error:
            outcomes[n] = Refused(error)
            continue
        candidates.append(_Candidate(n, request, quotas))
    if in_force.has_strict_lines and overruns is None:  # (what already runs is charged anyway)
        candidates = _not_behind(tx, in_force, candidates, outcomes)
    if not candidates:
        return outcomes
    if alone:
        (only,) = candidates
        made = only.request.pending(now)
        if not only.request.granting:
            # Our own new row first: a concurrent request with our key waits for it, then finds it.
            # (A grant's row is in line already, locked by the grant: it is written once decided.)
            tx.insert_reservation(made, only.request.request_hash, only.request.kube)
        if not only.request.resources:
            if undo is not None:
                undo.before_write()
            tx.ensure_partition(partition, now)  # no counter will name it; the sweeper must
        plan = _plan(tx, in_force, bounds, candidates, now, undo, overruns)
        outcomes.update(plan.refused)
        if plan.admitted:
            if only.request.granting:
                tx.grant_waiting(made.id, now, made.expires_at)
            with tx.writes_together():
                tx.apply_charges(plan.deltas, now)
            outcomes[only.place] = made
            if room is not None:
                room.append(plan.again())
        return outcomes
    candidates = _named(tx, partition, candidates)
    if candidates:
        outcomes.update(_decide_set(tx, in_force, bounds, candidates, now))
    return outcomes


def made_before(tx: LedgerTx, request: ReserveRequest) -> Reservation | None:
    """The reservation a request made already: its idempotency key's (or its conflict), or its
    own when a first attempt may have committed before the connection dropped."""
    if request.key is not None and (found := tx.find_reservation_by_key(request.partition, request.key)):
        return arguments.same_request(found, request.partition, request.key, request.request_hash)
    if tx.attempt and (found := tx.find_reservation(request.reservation_id)):
        return found.reservation
    return None


def _not_behind(
    tx: LedgerTx, rules: PartitionRules, candidates: list[_Candidate], outcomes: dict[int, Outcome]
) -> list[_Candidate]:
    """Those of ``candidates`` that pass no waiting request of a ``StrictFIFO`` line they share
    (:mod:`quota_ledger.model.line`); the others are refused, with the limits of those lines."""
    passing = []
    for candidate in candidates:
        request = candidate.request
        place = (request.queued_at, request.reservation_id) if request.queued_at is not None else None
        ahead = tx.line_ahead(request.partition, request.priority, place)
        asker = line.Asker(
            queue=request.queue,
            resources=request.resources,
            user=request.user,
            groups=request.groups,
            application=request.application,
        )
        found = line.behind(asker, ahead, rules.strict) if ahead else []
        if found:
            outcomes[candidate.place] = Refused(OverQuota(found))
        else:
            passing.append(candidate)
    return passing


def _quotas(rules: PartitionRules, request: ReserveRequest, *, charging: bool) -> list[ResourceQuota]:
    """The ResourceQuotas a request is charged to; raises the refusal of a request the
    partition's unknown names or the admission rules refuse. ``charging``: it runs already,
    and is charged to the quotas it matches, covered or not."""
    if charging:
        return resource_quotas.matching(rules, request.queue, request.kube)
    if (refused := refusal(rules, request)) is not None:
        raise refused
    return resource_quotas.admit(rules, request.queue, request.namespace, request.kube, request.missing)


@dataclass(frozen=True, slots=True)
class _Candidate:
    place: int
    request: ReserveRequest
    #: the ResourceQuotas it is charged to
    quotas: list[ResourceQuota]


def _named(tx: LedgerTx, partition: str, candidates: list[_Candidate]) -> list[_Candidate]:
    """Those of a set's ``candidates`` that name only resources the partition's counters name
    already (the others are decided alone, which checks the partition's bound of names)."""
    unnamed = tx.unnamed_resources(partition, {res for c in candidates for res in c.request.resources})
    return [c for c in candidates if unnamed.isdisjoint(c.request.resources)]


def _decide_set(
    tx: LedgerTx,
    rules: PartitionRules,
    bounds: validation.Bounds,
    candidates: Sequence[_Candidate],
    now: datetime,
) -> dict[int, Outcome]:
    """Decide a set of many inside a savepoint taken before its first write, and insert the
    reservations it admits."""
    undo = Undo(tx)
    with undo.on_failure():
        plan = _plan(tx, rules, bounds, candidates, now, undo, None)
        if plan.traces():
            assert undo.savepoint is not None  # a trace is a write
            undo.rollback()
            kept = {m.place for m in plan.admitted}
            again = [c for c in candidates if c.place in kept]
            refused = plan.refused
            plan = _plan(tx, rules, bounds, again, now, undo, None) if again else _Plan(members=[])
            if {m.place for m in plan.admitted} != kept:
                # cannot happen (the admitted ones saw the same rows): each is decided alone
                undo.rollback()
                return {}
            plan.refused = refused
        outcomes: dict[int, Outcome] = dict(plan.refused)
        made = {m.place: m.request.pending(now) for m in plan.admitted}
        if made:
            undo.before_write()
            with tx.writes_together():
                tx.insert_reservations(
                    [(made[m.place], m.request.request_hash, m.request.kube) for m in plan.admitted]
                )
                tx.apply_charges(plan.deltas, now)
    undo.release()
    outcomes.update(made)
    return outcomes


@dataclass(slots=True)
class _Plan:
    """What one pass over the members of a reserve decided."""

    members: list[reserve_tracking.Member]
    admitted: list[reserve_tracking.Member] = field(default_factory=list)
    #: the refusals, by place
    refused: dict[int, Outcome] = field(default_factory=dict)
    #: the queue counters and user/group counters this pass created
    made_pairs: set[tuple[str, str]] = field(default_factory=set)
    made_keys: set[Key] = field(default_factory=set)
    #: what the admitted members add to each counter
    deltas: dict[charges.CounterKey, tuple[int, int]] = field(default_factory=dict)
    #: what each member asked of the rule, in order
    asks: list[charges.Ask] = field(default_factory=list)

    def again(self) -> bool | None:
        """Whether the rule would admit a plan of one's member once more after it (None: not
        known, for a member whose first request may start its application)."""
        if len(self.asks) != 1 or self.members[0].app_key is not None:
            return None
        return charges.decide([self.asks[0], self.asks[0]])[1].admitted

    def traces(self) -> bool:
        """Whether a member that was not admitted left a row of its own: its application row
        (written for every member), or a counter no admitted member needs."""
        if len(self.admitted) == len(self.members):
            return False
        admitted = {m.place for m in self.admitted}
        if any(m.app_key is not None for m in self.members if m.place not in admitted):
            return True
        pairs = {(m.request.queue, res) for m in self.admitted for res in m.request.resources}
        keys = {key for m in self.admitted for key in m.scoped}
        return not (self.made_pairs <= pairs and self.made_keys <= keys)


def _plan(
    tx: LedgerTx,
    rules: PartitionRules,
    bounds: validation.Bounds,
    candidates: Sequence[_Candidate],
    now: datetime,
    undo: Undo | None,
    overruns: list[Violation] | None,
) -> _Plan:
    """Lock (and create) what ``candidates`` need, in the lock order, and decide each member.
    ``undo`` (a set of many): its savepoint is taken before the first write."""

    def before_write() -> None:
        if undo is not None:
            undo.before_write()

    partition = candidates[0].request.partition
    found, apps = reserve_tracking.members(tx, rules, [(c.place, c.request) for c in candidates], now)
    plan = _Plan(members=found, refused={n: Refused(error) for n, error in apps.refused.items()})
    if not found:
        return plan
    if tracked := {m.app_key for m in found if m.app_key is not None}:
        before_write()
        reserve_tracking.save(tx, apps, tracked)
    own, plan.made_pairs = _lock_own(tx, bounds, partition, found, now, before_write)
    scopes = {scope for m in found for scope in queues.lineage(m.request.queue)}
    subtree = tx.lock_subtree_counters(partition, scopes, {res for m in found for res in m.requested})
    limits = {(c.scope, c.resource): c for c in subtree}
    scoped, plan.made_keys = reserve_tracking.lock_counters(
        tx, partition, found, apps, now, before_write=before_write
    )
    quotas = {c.place: c.quotas for c in candidates}
    charged = resource_quotas.lock_many(
        tx, partition, [(m.request.queue, quotas[m.place], m.request.kube["usage"]) for m in found]
    )
    asks = []
    for member, counted in zip(found, charged, strict=True):
        theirs = [scoped[key] for key in sorted(member.scoped) if key in scoped]
        counters = [*_queue_counters(member, own, limits), *theirs, *counted]
        moves = charges.reserving(counters, member.requested, member.request.kube["usage"])
        asks.append(charges.Ask(partition, moves, overruns is None))
    plan.asks = asks
    decided = charges.decide(asks)
    for member, decision in zip(found, decided, strict=True):
        if overruns is not None:
            overruns += decision.violations
        if (error := decision.refusal()) is not None:
            plan.refused[member.place] = Refused(error)
        else:
            plan.admitted.append(member)
    plan.deltas = charges.summed(d for d in decided if d.admitted)
    return plan


def _queue_counters(
    member: reserve_tracking.Member,
    own: Mapping[tuple[str, str], Counter],
    limits: Mapping[tuple[str, str], Counter],
) -> list[Counter]:
    """The locked queue counters a member is charged to: its queue's own, then the limits of its
    lineage (``applications`` too, where it starts its application), each in the lock order,
    which is the order of the violations a refusal lists."""
    queue = member.request.queue
    mine = [c for resource in member.request.resources if (c := own.get((queue, resource))) is not None]
    chain = queues.lineage(queue)
    theirs = [c for scope in chain for resource in member.requested if (c := limits.get((scope, resource)))]
    return sorted(mine, key=_lock_order) + sorted(theirs, key=_lock_order)


def _lock_order(counter: Counter) -> tuple[str, str]:
    return counter.scope, counter.resource


def _lock_own(
    tx: LedgerTx,
    bounds: validation.Bounds,
    partition: str,
    found: Sequence[reserve_tracking.Member],
    now: datetime,
    before_write: Callable[[], None],
) -> tuple[dict[tuple[str, str], Counter], set[tuple[str, str]]]:
    """Lock the queues' own counters of the members, creating those used for the first time;
    the counters by (queue, resource), and those created."""
    pairs = {(m.request.queue, res) for m in found for res in m.request.resources}
    if tx.holds_queue_counters(partition, pairs):  # (a grant in the transaction that freed them)
        return tx.lock_queue_counters(partition, pairs), set()
    savepoint = tx.savepoint()
    own = tx.lock_queue_counters(partition, pairs)
    missing = pairs - own.keys()
    if savepoint is not None:
        if not missing:
            savepoint.commit()
        else:
            # Let go of the counters just locked (PostgreSQL): the missing ones are inserted
            # while this transaction holds no counter, then all are locked in order.
            savepoint.rollback()
    if missing:
        # Only a resource the partition names nowhere yet can bring it over its bound of names
        # (a set of many leaves such requests to be decided alone).
        resources = {res for _, res in missing}
        if tx.unnamed_resources(partition, resources):
            bounds.partition(tx.resource_names(partition) | resources, partition)
        before_write()
        # The partition's row first (PostgreSQL; elsewhere the partition lock made it): no
        # counter of a partition without its row exists for us to hold while we wait on it.
        tx.ensure_partition(partition, now)
        tx.insert_queue_counters(partition, sorted(missing), now)
        own = tx.lock_queue_counters(partition, pairs)
    return own, missing
