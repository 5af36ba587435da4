"""Reserve as a set: a batch's keyless reservations of one partition decided together.

On MariaDB and SQLite group commit would run each reservation's general path (:func:`.reserve.
general`) in a savepoint of its own, a dozen statements or more each, one after another while
the batch holds the counters. The keyless ones of a batch are decided here with a few
statements for all of them, as the general path would decide them one after another in batch
order, under the shared partition lock and the rules in force, in the lock order of
:mod:`quota_ledger.driver.tx`:

- the members' application rows are locked, opened in memory one member after another and
  written (:mod:`.reserve_set_tracking`);
- the queues' own counters are locked, the missing ones (first uses) inserted and locked;
- the subtree counters of the members' lineages are locked, ``applications`` too where a
  member starts its application;
- the user/group counters that enforce the members are locked, the missing ones (a user's
  copies of a wildcard limit, a new group's) created from the application rows first;
- the longest prefix whose running totals fit every limit (and the bigint range) is admitted,
  its reservations and items are inserted with one multi-row insert each, and every counter is
  updated once with the sum. Their ids are new, so inserting them after the decision cannot
  meet another row.

Rows are created for every member before the decision. When a member that is not admitted
has left a row of its own (its application row, a counter only it needed), the set goes back
to a savepoint taken before its first write and decides again with the admitted prefix only,
which admits it again: a refused request leaves no trace, as its own step would not.

Left to each one's own step (which admits it, or raises the refusal, as it would alone): a
request with an idempotency key or without resources, one the ResourceQuota admission rules
refuse or that a ResourceQuota counts, one naming a resource no counter of the partition
names yet (its step checks the partition's bound of names), one whose application row is
finished or belongs to another user or queue, the first one that does not fit and every one
after it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial

from quota_ledger.config.identity import Key
from quota_ledger.config.rules import PartitionRules
from quota_ledger.driver.tx import LedgerTx, Undo
from quota_ledger.ledger import reserve, reserve_set_tracking, resource_quotas
from quota_ledger.ledger.compiled import CompiledRules
from quota_ledger.ledger.group_decision import Together
from quota_ledger.ledger.resolve import by_key, counters_of
from quota_ledger.model import charges, queues
from quota_ledger.model.counters import Counter
from quota_ledger.model.errors import QuotaLedgerError
from quota_ledger.model.quantity import APPLICATIONS
from quota_ledger.model.requests import ReserveRequest
from quota_ledger.model.values import Reservation


def together(rules: CompiledRules, request: ReserveRequest) -> Together[Reservation] | None:
    """How group commit decides ``request`` with the other keyless ones of its partition
    (None: it has a key, or names no resource)."""
    if request.key is not None or not request.resources:
        return None
    return Together(("reserve", request.partition), request, partial(decide, rules=rules))


def decide(
    tx: LedgerTx, requests: Sequence[ReserveRequest], *, rules: CompiledRules
) -> dict[int, Reservation]:
    """Reserve what can be reserved of ``requests`` (keyless, of one partition) as their
    general paths would one after another; each reservation made, by its request's place."""
    if tx.attempt:
        # A first attempt may have committed: each step finds its own reservation.
        return {}
    partition = requests[0].partition
    now = tx.lock_partition(partition, exclusive=False)
    in_force = rules.partition(tx, partition)
    candidates = _candidates(tx, in_force, requests)
    if not candidates:
        return {}
    undo = Undo(tx)
    with undo.on_failure():
        plan = _plan(tx, in_force, candidates, now, undo)
        if plan.traces():
            assert undo.savepoint is not None  # a trace is a write
            undo.rollback()
            kept = {m.place for m in plan.admitted}
            if not kept:
                return {}
            plan = _plan(tx, in_force, [(n, r) for n, r in candidates if n in kept], now, undo)
            if {m.place for m in plan.admitted} != kept:
                # cannot happen (the prefix saw the same rows): leave every request to its step
                undo.rollback()
                return {}
        made = {m.place: m.request.pending(now) for m in plan.admitted}
        if made:
            undo.before_write()
            with tx.writes_together():
                tx.insert_reservations(
                    [(made[m.place], m.request.request_hash, m.request.kube) for m in plan.admitted]
                )
                tx.apply_counter_deltas(plan.deltas, now)
                tx.apply_identity_deltas(plan.identity_deltas, now)
    undo.release()
    return made


def _candidates(
    tx: LedgerTx, rules: PartitionRules, requests: Sequence[ReserveRequest]
) -> list[tuple[int, ReserveRequest]]:
    """The requests the set may decide, by place: those the ResourceQuota rules admit without
    counting them and the partition's unknown names do not refuse, naming only resources the
    partition's counters name already."""
    found: list[tuple[int, ReserveRequest]] = []
    for n, request in enumerate(requests):
        if reserve.refusal(rules, request) is not None:
            continue  # its step raises the refusal
        try:
            quotas = resource_quotas.admit(
                rules, request.queue, request.namespace, request.kube, request.missing
            )
        except QuotaLedgerError:
            continue  # its step raises the refusal
        if not quotas:
            found.append((n, request))
    if not found:
        return []
    unnamed = tx.unnamed_resources(found[0][1].partition, {res for _, r in found for res in r.resources})
    return [(n, r) for n, r in found if unnamed.isdisjoint(r.resources)]


@dataclass(slots=True)
class _Plan:
    """What one pass over a set's members decided."""

    members: list[reserve_set_tracking.Member]
    admitted: list[reserve_set_tracking.Member] = field(default_factory=list)
    #: the queue counters and user/group counters this pass created
    made_pairs: set[tuple[str, str]] = field(default_factory=set)
    made_keys: set[Key] = field(default_factory=set)
    #: counter id -> (in_use, reserved) to add, in quota_usages and in quota_identity_usages
    deltas: dict[int, tuple[int, int]] = field(default_factory=dict)
    identity_deltas: dict[int, tuple[int, int]] = field(default_factory=dict)

    def traces(self) -> bool:
        """Whether a member that was not admitted left a row of its own: its application row
        (written for every member), or a counter no admitted member needs."""
        if len(self.admitted) == len(self.members):
            return False
        if any(m.app_key is not None for m in self.members[len(self.admitted) :]):
            return True
        pairs = {(m.request.queue, res) for m in self.admitted for res in m.request.resources}
        keys = {key for m in self.admitted for key in m.scoped}
        return not (self.made_pairs <= pairs and self.made_keys <= keys)


def _plan(
    tx: LedgerTx,
    rules: PartitionRules,
    candidates: Sequence[tuple[int, ReserveRequest]],
    now: datetime,
    undo: Undo,
) -> _Plan:
    """Lock (and create) what ``candidates`` need, in the lock order, and decide the longest
    prefix of the members that fits."""
    partition = candidates[0][1].partition
    found, apps = reserve_set_tracking.members(tx, rules, candidates, now)
    plan = _Plan(members=found)
    if not found:
        return plan
    if tracked := {m.app_key for m in found if m.app_key is not None}:
        undo.before_write()
        reserve_set_tracking.save(tx, apps, tracked)
    pairs = {(m.request.queue, res) for m in found for res in m.request.resources}
    own = tx.lock_queue_counters(partition, pairs)
    plan.made_pairs = pairs - own.keys()
    if plan.made_pairs:
        undo.before_write()
        tx.insert_queue_counters(partition, sorted(plan.made_pairs), now)
        own = tx.lock_queue_counters(partition, pairs)
    scopes = {scope for m in found for scope in queues.lineage(m.request.queue)}
    limits = by_key(tx.lock_subtree_counters(partition, scopes, {res for m in found for res in m.requested}))
    scoped, plan.made_keys = reserve_set_tracking.lock_counters(
        tx, partition, found, apps, now, before_write=undo.before_write
    )
    _admit(partition, plan, own, limits, scoped)
    return plan


def _admit(
    partition: str,
    plan: _Plan,
    own: Mapping[tuple[str, str], Counter],
    limits: Mapping[tuple[str, str], Counter],
    scoped: Mapping[Key, Counter],
) -> None:
    """Admit the longest prefix of ``plan.members`` that the rule admits one after another,
    and sum what it adds to each counter."""
    asks = []
    for member in plan.members:
        requested = member.requested
        mine = counters_of(member.request, own, limits, applications=APPLICATIONS in requested)
        theirs = [scoped[key] for key in sorted(member.scoped) if key in scoped]
        asks.append(charges.Ask(partition, charges.reserving([*mine, *theirs], requested)))
    decided = charges.decide(asks)
    for member, decision in zip(plan.members, decided, strict=True):
        if not decision.admitted:
            break
        plan.admitted.append(member)
    plan.deltas, plan.identity_deltas = charges.split(charges.summed(decided[: len(plan.admitted)]))
