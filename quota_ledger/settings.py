"""Settings, built once at an entry point (CLI, service) and passed in; the library never reads
the environment itself."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_DB = "sqlite:///quota-ledger.db"


class Settings(BaseSettings):
    """``QUOTA_LEDGER_DB``, ``QUOTA_LEDGER_DEFAULT_TTL``, ``QUOTA_LEDGER_SWEEP_INTERVAL``, ..."""

    model_config = SettingsConfigDict(env_prefix="QUOTA_LEDGER_", extra="ignore")

    db: str = Field(DEFAULT_DB, description="database URL (SQLite file in the working directory by default)")
    default_ttl: float = Field(300.0, gt=0, description="seconds a reservation lives without a ttl")
    sweep_interval: float = Field(5.0, gt=0, description="seconds between expiry sweeps")
    sweep_batch_size: int = Field(500, ge=1, le=10_000, description="reservations per sweep transaction")
