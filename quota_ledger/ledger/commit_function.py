"""Commit by PostgreSQL's ``quota_ledger_commit_many``: a whole commit alone, or with its batch's.

What the function declines (listed in :mod:`quota_ledger.driver.pg_functions`: a reservation
not found, not pending, past its expiry, or without its application row), the rule's path
(:func:`.resolve.commit_general`) decides, and says which.
"""

from __future__ import annotations

import json
from datetime import UTC
from typing import Any

from quota_ledger.driver import pg_functions
from quota_ledger.driver.core import DbQuotaDriver
from quota_ledger.driver.tx import LedgerTx
from quota_ledger.ledger import resolve
from quota_ledger.ledger.compiled import CompiledRules
from quota_ledger.ledger.group_decision import ByFunction
from quota_ledger.model.values import Reservation, ReservationState


def by_function_or_general(
    driver: DbQuotaDriver, rules: CompiledRules, reservation_id: str, operation_id: str
) -> resolve.CommitOutcome:
    """Commit a pending reservation whole by the server function, or by the rule's path where
    the function declines (:mod:`.paths` chooses this for PostgreSQL)."""
    call = pg_functions.commit_many([pg_functions.commit_params(reservation_id, operation_id)])
    rows = driver.call(call.sql, call.params)
    if rows:
        return committed(reservation_id, rows[0]), False
    return driver.run(lambda tx: resolve.commit_general(tx, rules, reservation_id, None, operation_id))


def in_batch(
    tx: LedgerTx, reservation_id: str, operation_id: str
) -> ByFunction[resolve.CommitOutcome] | None:
    """How the function may commit a reservation whole with the batch's other whole commits
    (what it declines, the rule's path decides); None off PostgreSQL."""
    if tx.pg is None:
        return None

    def finish(rows: list[Any]) -> resolve.CommitOutcome | None:
        return (committed(reservation_id, rows[0]), False) if rows else None

    params = pg_functions.commit_params(reservation_id, operation_id)
    return ByFunction(("commit",), params, pg_functions.commit_many, finish)


def committed(reservation_id: str, row: Any) -> Reservation:
    """The reservation the function returned as ``row``."""
    resources = dict(zip(row.resources, row.amounts, strict=True))
    return Reservation(
        id=reservation_id,
        state=ReservationState.COMMITTED,
        partition=row.partition,
        queue=row.queue,
        resources=resources,
        created_at=row.created_at.replace(tzinfo=UTC),
        expires_at=row.expires_at.replace(tzinfo=UTC),
        key=row.key,
        user=row.user_name,
        groups=tuple(json.loads(row.groups)) if row.groups else (),
        application=row.application,
        priority_class=row.priority_class,
        committed=dict(resources),
        resolved_at=row.resolved_at.replace(tzinfo=UTC),
    )
