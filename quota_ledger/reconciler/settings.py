"""The reconciler's settings: ``QUOTA_LEDGER_RECONCILE_*`` in the environment, each also an
option of ``quota-ledger kube reconcile`` (the option wins). Built at the entry point and
passed in."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from quota_ledger.env_settings import EnvSettings


class ReconcilerSettings(EnvSettings):
    """``QUOTA_LEDGER_RECONCILE_RELIST_EVERY``, ``QUOTA_LEDGER_RECONCILE_LEASE_NAME``, ..."""

    env_prefix: ClassVar[str] = "QUOTA_LEDGER_RECONCILE_"

    relist_every: float = Field(300.0, gt=0, description="seconds between full relists of each kind")
    pending_grace: float = Field(
        60.0,
        gt=0,
        description="seconds after which a relist rolls back a pending reservation whose pod it lacks",
    )
    watch_timeout: float = Field(
        300.0, ge=1, description="seconds one watch request lasts before it is renewed (timeoutSeconds)"
    )
    leader_election: bool = Field(True, description="compete for the Lease; off: act at once, alone")
    lease_name: str = Field("quota-ledger-reconciler", min_length=1, description="the Lease's name")
    lease_namespace: str | None = Field(
        None, description="the Lease's namespace (unset: $POD_NAMESPACE, else quota-ledger)"
    )
    identity: str | None = Field(
        None, description="this replica's name in the Lease (unset: $POD_NAME, else the host name)"
    )
    lease_duration: float = Field(15.0, gt=0, description="seconds a Lease not renewed stays held")
    renew_deadline: float = Field(
        10.0, gt=0, description="seconds the leader keeps trying to renew before it stops"
    )
    retry_period: float = Field(2.0, gt=0, description="seconds between attempts to take or renew the Lease")
    write_status: bool = Field(False, description="write status.used back into ResourceQuota objects")
    status_every: float = Field(10.0, gt=0, description="seconds between writes of ResourceQuota status")
    metrics_port: int | None = Field(
        None, ge=0, le=65535, description="port of /metrics (unset: none served)"
    )
    metrics_host: str = Field("0.0.0.0", description="address /metrics listens on")  # noqa: S104
