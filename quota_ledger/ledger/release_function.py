"""Roll back or release by PostgreSQL's ``quota_ledger_release``: one plain reservation, in the
freeing transaction.

What the function declines (listed in :mod:`quota_ledger.driver.pg_functions`: another state, a
tracked reservation, one a ResourceQuota counter of its queue may count), the rule's path
(:func:`.resolve.rollback`, :func:`.release.release_reservation`) decides in the same
transaction, under the locks the function took.
"""

from __future__ import annotations

from quota_ledger.driver.tx import LedgerTx
from quota_ledger.ledger import release, resolve
from quota_ledger.ledger.compiled import CompiledRules
from quota_ledger.model.values import Reservation


def rollback(tx: LedgerTx, rules: CompiledRules, reservation_id: str) -> Reservation:
    """:func:`.resolve.rollback` by the function where it decides (a pending plain one)."""
    freed = tx.release_by_function(reservation_id, None, committed=False)
    return freed if freed is not None else resolve.rollback(tx, rules, reservation_id)


def release_reservation(
    tx: LedgerTx, rules: CompiledRules, reservation_id: str, finished: bool, operation_id: str
) -> Reservation:
    """:func:`.release.release_reservation` by the function where it decides (a plain one,
    pending or committed)."""
    freed = tx.release_by_function(reservation_id, operation_id, committed=True)
    if freed is not None:
        return freed
    return release.release_reservation(tx, rules, reservation_id, finished, operation_id)
