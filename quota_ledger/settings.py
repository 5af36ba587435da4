"""Settings, built once at an entry point (CLI, service) and passed in; the library never reads
the environment itself."""

from __future__ import annotations

from typing import Literal

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
    sweep_max_rate: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="reservations a sweep expires per second at most (unset: no limit)",
    )
    host: str = Field("127.0.0.1", description="address the HTTP service listens on")
    port: int = Field(8080, ge=0, le=65535, description="port of the HTTP service (0: any free port)")
    token_cache_seconds: float = Field(5.0, ge=0, description="how long a verified token is trusted")
    tls_certfile: str | None = Field(None, description="PEM certificate: serve HTTPS (else plain HTTP)")
    tls_keyfile: str | None = Field(None, description="PEM private key for tls_certfile")
    pool_size: int = Field(20, ge=1, le=200, description="database connections of the service")
    workers: int = Field(1, ge=1, le=64, description="worker processes of the HTTP service")
    access_log: Literal["text", "json", "off"] = Field(
        "text", description="the service's access log: a text line or a JSON object a request, or none"
    )
