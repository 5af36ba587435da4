"""The database side of the ledger: tables, named statements, locking, dialect differences."""

from __future__ import annotations

from quota_ledger.driver.core import DbQuotaDriver

__all__ = ["DbQuotaDriver"]
