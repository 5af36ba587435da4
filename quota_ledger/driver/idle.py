"""Counters at zero (``prune``): the rows that may go, what still names them, and their deletion.

``prune`` holds the partition lock exclusively (step 2 of :mod:`.tx`): no reservation, which
alone creates counters and the first uses of queues, users and groups, runs meanwhile. The
candidates are then locked in the canonical order (steps 5 and 7) and deleted only while they
are still at zero, so a commit, a release or an expiry that does not take the partition lock
and holds one of them is waited for, and a row it changed is kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, bindparam, delete, select

from quota_ledger.driver.counters import force_index
from quota_ledger.driver.schema import (
    PENDING,
    quota_applications,
    quota_identity_usages,
    quota_usages,
    reservation_items,
    reservations,
)
from quota_ledger.model.counters import QUEUE
from quota_ledger.model.values import IdleCounter

_U = quota_usages.c
_D = quota_identity_usages.c
_R = reservations.c
_A = quota_applications.c

# zero_queue_counters: a partition's queue counters at zero; no lock (a dry run).
_ZERO_QUEUE = (
    select(_U.id, _U.scope, _U.resource)
    .where(_U.partition == bindparam("p"), _U.scope_type == QUEUE, _U.in_use == 0, _U.reserved == 0)
    .order_by(_U.scope, _U.resource)
)
# lock_zero_queue_counters: the same, locked in the canonical order (step 5).
_LOCK_ZERO_QUEUE = force_index(
    _ZERO_QUEUE.with_for_update(), quota_usages, "uq_quota_usages_partition_scope_type_scope_resource"
)
# zero_identity_counters: a partition's user, group and ResourceQuota counters at zero; no lock.
_ZERO_IDENTITY = (
    select(_D.id, _D.kind, _D.name, _D.queue, _D.resource)
    .where(_D.partition == bindparam("p"), _D.in_use == 0, _D.reserved == 0)
    .order_by(_D.kind, _D.name, _D.queue, _D.resource)
)
# lock_zero_identity_counters: the same, locked in the canonical order (step 7).
_LOCK_ZERO_IDENTITY = force_index(
    _ZERO_IDENTITY.with_for_update(),
    quota_identity_usages,
    "uq_quota_identity_usages_partition_kind_name_queue_resource",
)
# pending_pairs: the (queue, resource) pairs pending reservations name; no lock.
_PENDING_PAIRS = (
    select(_R.queue, reservation_items.c.resource)
    .join(reservation_items, reservation_items.c.reservation_id == _R.id)
    .where(_R.partition == bindparam("p"), _R.state == PENDING)
    .distinct()
)
# pending_users: the users pending reservations are for; no lock.
_PENDING_USERS = (
    select(_R.user_name)
    .where(_R.partition == bindparam("p"), _R.state == PENDING, _R.user_name.is_not(None))
    .distinct()
)
# running_identities: the (user, group) of every running application; no lock (one that stops
# meanwhile only keeps its counters until the next prune).
_RUNNING = (
    select(_A.user_name, _A.group_name)
    .where(_A.partition == bindparam("p"), _A.state == "running")
    .distinct()
)
# delete_idle_*: the locked candidates still at zero.
_DELETE_QUEUE = delete(quota_usages).where(
    _U.id.in_(bindparam("ids", expanding=True)), _U.scope_type == QUEUE, _U.in_use == 0, _U.reserved == 0
)
_DELETE_IDENTITY = delete(quota_identity_usages).where(
    _D.id.in_(bindparam("ids", expanding=True)), _D.in_use == 0, _D.reserved == 0
)
#: ids one delete statement names at most
_ID_SLICE = 500


class IdleStatements:
    """The statements above, as methods of :class:`~quota_ledger.driver.tx.LedgerTx`."""

    conn: Connection

    def zero_counters(self, partition: str, *, lock: bool) -> list[tuple[int, IdleCounter]]:
        """(id, counter) of every queue, user, group and ResourceQuota counter of ``partition``
        at zero; ``lock``: locked, queue counters first (caller holds the partition lock)."""
        params = {"p": partition}
        queue_rows = self.conn.execute(_LOCK_ZERO_QUEUE if lock else _ZERO_QUEUE, params).all()
        named_rows = self.conn.execute(_LOCK_ZERO_IDENTITY if lock else _ZERO_IDENTITY, params).all()
        found = [
            (row.id, IdleCounter(partition=partition, kind=QUEUE, queue=row.scope, resource=row.resource))
            for row in queue_rows
        ]
        found += [
            (
                row.id,
                IdleCounter(
                    partition=partition, kind=row.kind, queue=row.queue, resource=row.resource, name=row.name
                ),
            )
            for row in named_rows
        ]
        return found

    def pending_pairs(self, partition: str) -> set[tuple[str, str]]:
        """The (queue, resource) pairs of the partition's pending reservations."""
        return {(row.queue, row.resource) for row in self.conn.execute(_PENDING_PAIRS, {"p": partition})}

    def live_identities(self, partition: str) -> tuple[set[str], set[str]]:
        """(users, groups) with a pending reservation or a running application."""
        users = set(self.conn.execute(_PENDING_USERS, {"p": partition}).scalars())
        groups: set[str] = set()
        for row in self.conn.execute(_RUNNING, {"p": partition}):
            if row.user_name is not None:
                users.add(row.user_name)
            if row.group_name is not None:
                groups.add(row.group_name)
        return users, groups

    def delete_idle(self, queue_ids: Sequence[int], identity_ids: Sequence[int]) -> int:
        """Delete the counters of these ids that are still at zero; how many went."""
        gone = 0
        for statement, ids in ((_DELETE_QUEUE, list(queue_ids)), (_DELETE_IDENTITY, list(identity_ids))):
            for start in range(0, len(ids), _ID_SLICE):
                result: Any = self.conn.execute(statement, {"ids": ids[start : start + _ID_SLICE]})
                gone += result.rowcount
        return gone
