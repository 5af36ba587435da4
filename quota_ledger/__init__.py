"""quota-ledger: a database-backed quota ledger (reserve, then commit or roll back)."""

from __future__ import annotations

from quota_ledger.driver import DbQuotaDriver
from quota_ledger.engine import QuotaEngine
from quota_ledger.errors import (
    CounterOverflow,
    DatabaseUnavailable,
    IdempotencyConflict,
    InvalidCommit,
    InvalidQuantity,
    InvalidRequest,
    OverQuota,
    QuotaLedgerError,
    ReservationNotFound,
    ReservationStateError,
    SchemaNotReady,
    UsageUnderflow,
)
from quota_ledger.quantity import format_quantity, parse_quantity
from quota_ledger.values import Drift, Reservation, ReservationState, Usage, Violation

__all__ = [
    "CounterOverflow",
    "DatabaseUnavailable",
    "DbQuotaDriver",
    "Drift",
    "IdempotencyConflict",
    "InvalidCommit",
    "InvalidQuantity",
    "InvalidRequest",
    "OverQuota",
    "QuotaEngine",
    "QuotaLedgerError",
    "Reservation",
    "ReservationNotFound",
    "ReservationState",
    "ReservationStateError",
    "SchemaNotReady",
    "Usage",
    "UsageUnderflow",
    "Violation",
    "format_quantity",
    "parse_quantity",
]
