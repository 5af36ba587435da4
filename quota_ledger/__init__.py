"""quota-ledger: a database-backed quota ledger (reserve, then commit or roll back)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
        ManagedQueue,
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
        UnknownQueue,
        UnknownResource,
        UsageUnderflow,
        UserNotFound,
        WaitTimeout,
    )
    from quota_ledger.model.quantity import format_human, format_quantity, parse_quantity
    from quota_ledger.model.values import (
        Blocker,
        ConfigProblem,
        Drift,
        Explanation,
        Holder,
        HolderKind,
        IdleCounter,
        LimitsVersion,
        Reservation,
        ReservationState,
        Usage,
        Violation,
    )

# The public names are imported when first asked for, not with the package: every module of the
# package imports it first, and the command line would otherwise load SQLAlchemy, pydantic and
# the whole engine before it has read its arguments (``quota-ledger --help`` among them).
_HOMES = {
    "AmbiguousReservationId": "quota_ledger.model.errors",
    "ApplicationNotFound": "quota_ledger.model.errors",
    "Blocker": "quota_ledger.model.values",
    "ConfigDiff": "quota_ledger.config.diff",
    "ConfigError": "quota_ledger.model.errors",
    "ConfigProblem": "quota_ledger.model.values",
    "CounterOverflow": "quota_ledger.model.errors",
    "DatabaseUnavailable": "quota_ledger.model.errors",
    "DatabaseUnreachable": "quota_ledger.model.errors",
    "DbQuotaDriver": "quota_ledger.driver",
    "Drift": "quota_ledger.model.values",
    "Explanation": "quota_ledger.model.values",
    "GroupNotFound": "quota_ledger.model.errors",
    "Holder": "quota_ledger.model.values",
    "HolderKind": "quota_ledger.model.values",
    "IdempotencyConflict": "quota_ledger.model.errors",
    "IdleCounter": "quota_ledger.model.values",
    "InvalidCommit": "quota_ledger.model.errors",
    "InvalidQuantity": "quota_ledger.model.errors",
    "InvalidRequest": "quota_ledger.model.errors",
    "InvalidResourceQuota": "quota_ledger.model.errors",
    "LedgerMissing": "quota_ledger.model.errors",
    "LimitChange": "quota_ledger.config.diff",
    "LimitsVersion": "quota_ledger.model.values",
    "ManagedQueue": "quota_ledger.model.errors",
    "MissingCoveringQuota": "quota_ledger.model.errors",
    "NotFound": "quota_ledger.model.errors",
    "OverLimit": "quota_ledger.config.diff",
    "OverQuota": "quota_ledger.model.errors",
    "PodMissingResources": "quota_ledger.model.errors",
    "QuotaEngine": "quota_ledger.engine",
    "QuotaLedgerError": "quota_ledger.model.errors",
    "RemovesAllLimits": "quota_ledger.model.errors",
    "Reservation": "quota_ledger.model.values",
    "ReservationIdTooShort": "quota_ledger.model.errors",
    "ReservationNotFound": "quota_ledger.model.errors",
    "ReservationState": "quota_ledger.model.values",
    "ReservationStateError": "quota_ledger.model.errors",
    "WaitTimeout": "quota_ledger.model.errors",
    "ResourceQuotaNotFound": "quota_ledger.model.errors",
    "SchemaNotReady": "quota_ledger.model.errors",
    "TooManyResources": "quota_ledger.model.errors",
    "UnknownQueue": "quota_ledger.model.errors",
    "UnknownResource": "quota_ledger.model.errors",
    "Usage": "quota_ledger.model.values",
    "UsageUnderflow": "quota_ledger.model.errors",
    "UserNotFound": "quota_ledger.model.errors",
    "Violation": "quota_ledger.model.values",
    "format_human": "quota_ledger.model.quantity",
    "format_quantity": "quota_ledger.model.quantity",
    "parse_quantity": "quota_ledger.model.quantity",
}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        value = getattr(importlib.import_module(_HOMES[name]), name)
        globals()[name] = value
        return value
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
    "Blocker",
    "ConfigDiff",
    "ConfigError",
    "ConfigProblem",
    "CounterOverflow",
    "DatabaseUnavailable",
    "DatabaseUnreachable",
    "DbQuotaDriver",
    "Drift",
    "Explanation",
    "GroupNotFound",
    "Holder",
    "HolderKind",
    "IdempotencyConflict",
    "IdleCounter",
    "InvalidCommit",
    "InvalidQuantity",
    "InvalidRequest",
    "InvalidResourceQuota",
    "LedgerMissing",
    "LimitChange",
    "LimitsVersion",
    "ManagedQueue",
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
    "UnknownQueue",
    "UnknownResource",
    "Usage",
    "UsageUnderflow",
    "UserNotFound",
    "Violation",
    "WaitTimeout",
    "format_human",
    "format_quantity",
    "parse_quantity",
    "__version__",
]


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
