"""quota-ledger: a database-backed quota ledger (reserve, then commit or roll back)."""

from __future__ import annotations

from quota_ledger.driver import DbQuotaDriver
from quota_ledger.engine import QuotaEngine
from quota_ledger.errors import (
    ApplicationNotFound,
    ConfigError,
    CounterOverflow,
    DatabaseUnavailable,
    GroupNotFound,
    IdempotencyConflict,
    InvalidCommit,
    InvalidQuantity,
    InvalidRequest,
    InvalidResourceQuota,
    MissingCoveringQuota,
    NotFound,
    OverQuota,
    PodMissingResources,
    QuotaLedgerError,
    ReservationNotFound,
    ReservationStateError,
    ResourceQuotaNotFound,
    SchemaNotReady,
    UsageUnderflow,
    UserNotFound,
)
from quota_ledger.quantity import format_quantity, parse_quantity
from quota_ledger.values import ConfigProblem, Drift, Reservation, ReservationState, Usage, Violation

__all__ = [
    "ApplicationNotFound",
    "ConfigError",
    "ConfigProblem",
    "CounterOverflow",
    "DatabaseUnavailable",
    "DbQuotaDriver",
    "Drift",
    "GroupNotFound",
    "IdempotencyConflict",
    "InvalidCommit",
    "InvalidQuantity",
    "InvalidRequest",
    "InvalidResourceQuota",
    "MissingCoveringQuota",
    "NotFound",
    "OverQuota",
    "PodMissingResources",
    "QuotaEngine",
    "QuotaLedgerError",
    "Reservation",
    "ReservationNotFound",
    "ReservationState",
    "ReservationStateError",
    "ResourceQuotaNotFound",
    "SchemaNotReady",
    "Usage",
    "UsageUnderflow",
    "UserNotFound",
    "Violation",
    "format_quantity",
    "parse_quantity",
]
