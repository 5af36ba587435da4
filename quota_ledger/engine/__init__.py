"""The engine: :class:`QuotaEngine`, the facade service code holds, and its prepared operations."""

from __future__ import annotations

from quota_ledger.engine.base import DEFAULT_PARTITION, DEFAULT_TTL, Operation
from quota_ledger.engine.core import QuotaEngine

__all__ = ["DEFAULT_PARTITION", "DEFAULT_TTL", "Operation", "QuotaEngine"]
