"""Settings, built once at an entry point (CLI, service) and passed in; the library never reads
the environment itself."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from quota_ledger.env_settings import EnvSettings
from quota_ledger.model import validation
from quota_ledger.model.errors import InvalidRequest
from quota_ledger.runtime import location


class UnusableSetting(InvalidRequest):
    """A setting is given that cannot take effect without another; the service did not start."""

    def __init__(self, setting: str, needs: tuple[str, ...], message: str | None = None) -> None:
        #: the setting given, and the settings it takes effect with
        self.setting = setting
        self.needs = needs
        super().__init__(message, field=setting)


class Settings(EnvSettings):
    """``QUOTA_LEDGER_DB``, ``QUOTA_LEDGER_DEFAULT_TTL``, ``QUOTA_LEDGER_SWEEP_INTERVAL``, ...;
    keyword arguments win over the environment, which wins over the settings file
    (``_env_file``, see :class:`~quota_ledger.env_settings.EnvSettings`)."""

    env_prefix: ClassVar[str] = "QUOTA_LEDGER_"

    db: str = Field(
        default_factory=location.default_db_url,
        description="database URL (default: the SQLite file $XDG_DATA_HOME/quota-ledger/ledger.db, "
        "XDG_DATA_HOME being ~/.local/share unless set); several URLs separated by spaces are the "
        "writer candidates in order of preference (a PostgreSQL primary and its standbys, Galera nodes)",
    )
    read_db: str | None = Field(
        None,
        description="replica URLs, separated by spaces, for reads that may be slightly stale "
        "(unset: every read goes to db)",
    )
    retry_attempts: int = Field(10, ge=1, le=1000, description="attempts one operation makes at most")
    retry_seconds: float = Field(
        15.0,
        gt=0,
        allow_inf_nan=False,
        description="seconds one operation is retried at most (the default rides out a failover of ~9 s)",
    )
    galera_sync_wait: int = Field(
        1, ge=0, le=15, description="wsrep_sync_wait of the writer's sessions on Galera (0: the server's)"
    )
    default_ttl: float = Field(300.0, gt=0, description="seconds a reservation lives without a ttl")
    sweep_interval: float = Field(5.0, gt=0, description="seconds between expiry sweeps")
    sweep_batch_size: int = Field(500, ge=1, le=10_000, description="reservations per sweep transaction")
    sweep_max_rate: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="reservations a sweep expires per second at most (unset: no limit)",
    )
    sweep_unready_after: float = Field(
        60.0,
        gt=0,
        allow_inf_nan=False,
        description="seconds the service's expiry sweep may keep failing before /readyz answers 503",
    )
    host: str = Field("127.0.0.1", description="address the HTTP service listens on")
    port: int = Field(8080, ge=0, le=65535, description="port of the HTTP service (0: any free port)")
    max_header_bytes: int = Field(
        65_536, ge=1024, le=16 * 1024 * 1024, description="bytes of a request head; more: 431"
    )
    max_headers: int = Field(100, ge=8, le=10_000, description="headers of a request; more: 431")
    header_timeout: float = Field(
        10.0, gt=0, le=3600, description="seconds a request's head may take to arrive; then 408"
    )
    trusted_proxies: str = Field(
        "",
        description="comma-separated addresses (or *) whose X-Forwarded-For/-Proto are believed",
    )
    keep_alive_timeout: float = Field(5.0, gt=0, le=3600, description="seconds an idle connection is kept")
    max_connections: int = Field(
        1000, ge=1, le=100_000, description="connections served at once (per process); more: 503"
    )
    token_cache_seconds: float = Field(5.0, ge=0, description="how long a verified token is trusted")
    session_max_age: int = Field(
        8 * 3600,
        ge=60,
        le=30 * 24 * 3600,
        description="seconds a browser stays signed in to the dashboard (the session cookie's Max-Age)",
    )
    tls_at_proxy: bool = Field(
        False,
        description="TLS ends at a proxy in front of the service: browsers reach it over HTTPS, so "
        "the session cookie is Secure (named __Host-...) and pages send Strict-Transport-Security",
    )
    tls_certfile: str | None = Field(None, description="PEM certificate: serve HTTPS (else plain HTTP)")
    tls_keyfile: str | None = Field(None, description="PEM private key for tls_certfile")
    tls_client_ca: str | None = Field(
        None,
        description="PEM CA bundle: a client certificate it verifies is taken as the admission role "
        "(the API server calling the admission webhook); clients without one still use tokens",
    )
    admission_ttl: float = Field(
        120.0,
        gt=0,
        allow_inf_nan=False,
        description="seconds a pod admitted by the webhook stays pending until it is seen stored",
    )
    admission_trusted_users: str = Field(
        "",
        description="comma-separated users (system:serviceaccount:NAMESPACE:NAME) whose pods may "
        "name who pays in the yunikorn.apache.org/user.info annotation",
    )
    pool_size: int = Field(20, ge=1, le=200, description="database connections of the service")
    batching: bool = Field(
        True,
        description="decide concurrent reservations, commits and rollbacks many per database "
        "transaction (group commit); off: one transaction each",
    )
    max_batch: int = Field(
        256, ge=1, le=10_000, description="requests one group-commit transaction decides at most"
    )
    workers: int = Field(1, ge=1, le=64, description="worker processes of the HTTP service")
    max_resources_per_request: int = Field(
        validation.DEFAULT_MAX_RESOURCES_PER_REQUEST,
        ge=1,
        description="resources one reserve, commit or release may name",
    )
    max_resources_per_limit_set: int = Field(
        validation.DEFAULT_MAX_RESOURCES_PER_LIMIT_SET,
        ge=1,
        description="resources one limit set (a queue's max, a user or group limit, a quota's hard) may name",
    )
    max_resources_per_partition: int = Field(
        validation.DEFAULT_MAX_RESOURCES_PER_PARTITION,
        ge=1,
        description="distinct resources the counters and limits of one partition may name",
    )
    access_log: Literal["text", "json", "off"] = Field(
        "text", description="the service's access log: a text line or a JSON object a request, or none"
    )
    openstack_sync_interval: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="seconds between syncs of Keystone's unified limits run by the service (unset: "
        "none; needs the openstack extra)",
    )
    openstack_cloud: str | None = Field(
        None,
        description="the clouds.yaml cloud the Keystone sync reads as (unset: OS_CLOUD, else the "
        "OS_* variables)",
    )
    openstack_services: str = Field(
        "",
        description="comma-separated services (id, name or type) whose limits the Keystone sync "
        "takes (empty: every service)",
    )
    openstack_region: str | None = Field(
        None,
        description="the region whose limits the Keystone sync takes with those of no region "
        "(unset: those of no region)",
    )
    openstack_missing_registered: Literal["zero", "unlimited"] = Field(
        "zero",
        description="a resource with no registered limit, for a project without its own: zero "
        "refuses it (as oslo.limit does), unlimited sets no max",
    )

    @property
    def db_urls(self) -> list[str]:
        """The URLs of :attr:`db`: ``QuotaEngine.from_url``'s first argument."""
        return location.split_urls(self.db)

    @property
    def trusted_users(self) -> frozenset[str]:
        """The users of :attr:`admission_trusted_users`."""
        return frozenset(each.strip() for each in self.admission_trusted_users.split(",") if each.strip())

    @property
    def read_db_urls(self) -> list[str]:
        """The URLs of :attr:`read_db` (none when unset)."""
        return location.split_urls(self.read_db or "")

    def check_serving(self) -> None:
        """Raise :class:`UnusableSetting` for a setting the service could not honour: a client CA
        (:attr:`tls_client_ca`) without a certificate to serve TLS with, which would otherwise
        be ignored, leaving the API server that presents a client certificate unauthenticated."""
        if self.tls_client_ca and not (self.tls_certfile and self.tls_keyfile):
            raise UnusableSetting(
                "tls_client_ca",
                ("tls_certfile", "tls_keyfile"),
                "QUOTA_LEDGER_TLS_CLIENT_CA is set but the service would serve plain HTTP, where no "
                "client presents a certificate: give a certificate and key (--tls-certfile and "
                "--tls-keyfile, or QUOTA_LEDGER_TLS_CERTFILE and QUOTA_LEDGER_TLS_KEYFILE), or unset "
                "QUOTA_LEDGER_TLS_CLIENT_CA",
            )

    def engine_options(self) -> dict[str, Any]:
        """The keyword arguments of ``QuotaEngine.from_url`` that these settings give."""
        return {
            "read_urls": self.read_db_urls or None,
            "retry_attempts": self.retry_attempts,
            "retry_seconds": self.retry_seconds,
            "galera_sync_wait": self.galera_sync_wait,
            "default_ttl": self.default_ttl,
            "pool_size": self.pool_size,
            "max_resources_per_request": self.max_resources_per_request,
            "max_resources_per_limit_set": self.max_resources_per_limit_set,
            "max_resources_per_partition": self.max_resources_per_partition,
            "batching": self.batching,
            "max_batch": self.max_batch,
        }
