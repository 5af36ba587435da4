"""Request and response bodies of the HTTP API (pydantic): the OpenAPI document is built from them."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from quota_ledger import history
from quota_ledger.values import Reservation, Usage

Quantity = str | int
NAME = r"^[^\x00-\x1f\x7f]{1,255}$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ReserveBody(_Strict):
    """A reservation: a queue and resources, or a Kubernetes Pod under ``pod``."""

    queue: str | None = Field(None, max_length=255, examples=["root.project-a"])
    resources: dict[str, Quantity] = Field(default_factory=dict, examples=[{"fpga": 2, "memory": "4Gi"}])
    partition: str = Field("default", max_length=64)
    user: str | None = Field(None, pattern=NAME)
    groups: list[str] = Field(default_factory=list, max_length=256)
    application: str | None = Field(None, pattern=NAME)
    priority_class: str | None = Field(None, pattern=NAME)
    terminating: bool = False
    best_effort: bool | None = None
    cross_namespace_affinity: bool = False
    ttl: float | None = Field(None, gt=0, le=7 * 24 * 3600)
    key: str | None = Field(None, pattern=NAME)
    pod: dict[str, Any] | None = None


class CommitBody(_Strict):
    resources: dict[str, Quantity] | None = None


class ReleaseBody(_Strict):
    queue: str = Field(..., max_length=255)
    resources: dict[str, Quantity]
    partition: str = Field("default", max_length=64)
    user: str | None = Field(None, pattern=NAME)
    groups: list[str] = Field(default_factory=list, max_length=256)
    application: str | None = Field(None, pattern=NAME)
    finished: bool = False


class ReleaseReservationBody(_Strict):
    finished: bool = False


class LimitsBody(_Strict):
    resources: dict[str, Quantity | None]
    partition: str = Field("default", max_length=64)


class ReservationOut(BaseModel):
    id: str
    state: str
    partition: str
    queue: str
    resources: dict[str, int]
    created_at: datetime
    expires_at: datetime
    key: str | None = None
    user: str | None = None
    groups: list[str] = []
    application: str | None = None
    priority_class: str | None = None
    committed: dict[str, int] | None = None
    resolved_at: datetime | None = None
    released_at: datetime | None = None

    @classmethod
    def of(cls, reservation: Reservation) -> ReservationOut:
        data = dataclasses.asdict(reservation)
        data["state"] = reservation.state.value
        data["groups"] = list(reservation.groups)
        return cls(**data)


class UsageOut(BaseModel):
    in_use: int
    reserved: int
    limit: int | None
    available: int | None

    @classmethod
    def of(cls, usage: Usage) -> UsageOut:
        return cls(in_use=usage.in_use, reserved=usage.reserved, limit=usage.limit, available=usage.available)


class HistoryPointOut(BaseModel):
    """The subtree's usage at ``time``, per resource, in base units."""

    time: datetime
    in_use: dict[str, int]
    reserved: dict[str, int]


class UsageHistoryOut(BaseModel):
    """In-use and reserved usage of a queue's subtree over a window, one point a step."""

    partition: str
    queue: str
    window: str = Field(..., examples=["1h"])
    step: int = Field(..., description="seconds between two points")
    start: datetime
    end: datetime
    limits: dict[str, int] = Field(..., description="the queue's own limits now")
    resources: list[str]
    points: list[HistoryPointOut]

    @classmethod
    def of(cls, found: history.UsageHistory) -> UsageHistoryOut:
        return cls(
            partition=found.partition,
            queue=found.queue,
            window=found.window.name,
            step=found.window.step,
            start=found.start,
            end=found.end,
            limits=found.limits,
            resources=found.resources,
            points=[HistoryPointOut(time=p.time, in_use=p.in_use, reserved=p.reserved) for p in found.points],
        )


class VersionOut(BaseModel):
    version: int


class ProblemOut(BaseModel):
    partition: str
    queue: str
    limit: str
    message: str


class ValidationOut(BaseModel):
    allowed: bool
    problems: list[ProblemOut]


class QuotaStatusOut(BaseModel):
    hard: dict[str, str]
    used: dict[str, str]


class DriftOut(BaseModel):
    partition: str
    scope_type: str
    scope: str
    resource: str
    in_use: int
    reserved: int
    expected_in_use: int
    expected_reserved: int
    fixed: bool
    name: str | None = None


class ErrorDetail(BaseModel):
    code: str
    message: str
    details: dict[str, Any] | None = None


class ErrorOut(BaseModel):
    error: ErrorDetail


class YAPIError(BaseModel):
    """YuniKorn's error body."""

    status_code: int
    message: str
    description: str
