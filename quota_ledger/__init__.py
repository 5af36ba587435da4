"""quota-ledger: a database-backed quota ledger (reserve, then commit or roll back)."""

from __future__ import annotations

from quota_ledger.config.diff import ConfigDiff, LimitChange, OverLimit
from quota_ledger.driver import DbQuotaDriver
from quota_ledger.engine import QuotaEngine
from quota_ledger.model.errors import (
    AmbiguousReservationId,
    ApplicationNotFound,
    ConfigError,
    CounterOverflow,
    DatabaseUnavailable,
    DatabaseUnreachable,
    GroupNotFound,
    IdempotencyConflict,
    InvalidCommit,
    InvalidQuantity,
    InvalidRequest,
    InvalidResourceQuota,
    LedgerMissing,
    MissingCoveringQuota,
    NotFound,
    OverQuota,
    PodMissingResources,
    QuotaLedgerError,
    RemovesAllLimits,
    ReservationIdTooShort,
    ReservationNotFound,
    ReservationStateError,
    ResourceQuotaNotFound,
    SchemaNotReady,
    TooManyResources,
    UsageUnderflow,
    UserNotFound,
)
from quota_ledger.model.quantity import format_human, format_quantity, parse_quantity
from quota_ledger.model.values import ConfigProblem, Drift, Reservation, ReservationState, Usage, Violation


def __getattr__(name: str) -> str:
    # ``__version__`` is read from the installed package's metadata when first asked for, not at
    # import: the lookup scans the environment, and every CLI command imports this package.
    if name == "__version__":
        from importlib import metadata

        try:
            version = metadata.version("quota-ledger")
        except metadata.PackageNotFoundError:  # a source tree that was never installed
            version = "0+unknown"
        globals()["__version__"] = version
        return version
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AmbiguousReservationId",
    "ApplicationNotFound",
    "ConfigDiff",
    "ConfigError",
    "ConfigProblem",
    "CounterOverflow",
    "DatabaseUnavailable",
    "DatabaseUnreachable",
    "DbQuotaDriver",
    "Drift",
    "GroupNotFound",
    "IdempotencyConflict",
    "InvalidCommit",
    "InvalidQuantity",
    "InvalidRequest",
    "InvalidResourceQuota",
    "LedgerMissing",
    "LimitChange",
    "MissingCoveringQuota",
    "NotFound",
    "OverLimit",
    "OverQuota",
    "PodMissingResources",
    "QuotaEngine",
    "QuotaLedgerError",
    "RemovesAllLimits",
    "Reservation",
    "ReservationIdTooShort",
    "ReservationNotFound",
    "ReservationState",
    "ReservationStateError",
    "ResourceQuotaNotFound",
    "SchemaNotReady",
    "TooManyResources",
    "Usage",
    "UsageUnderflow",
    "UserNotFound",
    "Violation",
    "format_human",
    "format_quantity",
    "parse_quantity",
    "__version__",
]
