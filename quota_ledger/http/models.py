"""Request and response bodies of the HTTP API (pydantic): the OpenAPI document is built from them.

Request fields the Python API also takes are passed through as sent and checked by the engine
(:mod:`quota_ledger.model.validation`), so that both refuse the same values with the same error; their
types here only describe them in the OpenAPI document.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from quota_ledger.model import history
from quota_ledger.model.validation import MAX_GROUPS, MAX_NAME_LENGTH
from quota_ledger.model.values import Reservation, Usage

_NULL = {"type": "null"}
#: a quantity string (``"250m"``, ``"4Gi"``) or an integer; floats and booleans are refused
Quantity = Annotated[Any, WithJsonSchema({"anyOf": [{"type": "string"}, {"type": "integer"}]})]
LimitQuantity = Annotated[Any, WithJsonSchema({"anyOf": [{"type": "string"}, {"type": "integer"}, _NULL]})]
Name = Annotated[Any, WithJsonSchema({"anyOf": [{"type": "string", "maxLength": MAX_NAME_LENGTH}, _NULL]})]
Names = Annotated[
    Any,
    WithJsonSchema(
        {"anyOf": [{"type": "array", "items": {"type": "string"}, "maxItems": MAX_GROUPS}, _NULL]}
    ),
]
Flag = Annotated[Any, WithJsonSchema({"type": "boolean"})]
OptionalFlag = Annotated[Any, WithJsonSchema({"anyOf": [{"type": "boolean"}, _NULL]})]
Seconds = Annotated[
    Any,
    WithJsonSchema({"anyOf": [{"type": "number", "exclusiveMinimum": 0, "maximum": 7 * 24 * 3600}, _NULL]}),
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ReserveBody(_Strict):
    """A reservation: a queue and resources, or a Kubernetes Pod under ``pod``."""

    queue: str | None = Field(None, max_length=255, examples=["root.project-a"])
    resources: dict[str, Quantity] = Field(default_factory=dict, examples=[{"fpga": 2, "memory": "4Gi"}])
    partition: str = Field("default", max_length=64)
    user: Name = None
    groups: Names = None
    application: Name = None
    priority_class: Name = None
    terminating: Flag = False
    best_effort: OptionalFlag = None
    cross_namespace_affinity: Flag = False
    ttl: Seconds = None
    key: Name = None
    pod: dict[str, Any] | None = None
    #: wait up to this many seconds for capacity in line instead of a refusal (202 while it waits)
    wait: Seconds = None
    #: of two waiting requests, the higher is tried first
    priority: Annotated[Any, WithJsonSchema({"type": "integer"})] = 0


class CommitBody(_Strict):
    resources: dict[str, Quantity] | None = None


class ReleaseBody(_Strict):
    queue: str = Field(..., max_length=255)
    resources: dict[str, Quantity]
    partition: str = Field("default", max_length=64)
    user: Name = None
    groups: Names = None
    application: Name = None
    finished: Flag = False
    #: the release happens once per key: a repeated call changes nothing
    key: Name = None


class ReleaseReservationBody(_Strict):
    finished: Flag = False


class LimitsBody(_Strict):
    resources: dict[str, LimitQuantity]
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
    #: what a reserve named that no configuration knows, a likely typo (also ``Warning`` headers)
    warnings: list[str] = []
    #: what it waited, or waits, with in line
    priority: int = 0
    #: while it waits: its place in its partition's line (1 = next to be tried)
    position: int | None = None

    @classmethod
    def of(cls, reservation: Reservation) -> ReservationOut:
        data = dataclasses.asdict(reservation)
        data["state"] = reservation.state.value
        data["groups"] = list(reservation.groups)
        data["warnings"] = list(reservation.warnings)
        return cls(**data)


class WaitingOut(BaseModel):
    """A line of requests waiting for capacity, in the order they are tried."""

    waiting: list[ReservationOut]


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


class LimitsOut(VersionOut):
    """What ``PUT /v1/queues/{path}/limits`` answers: the version in force after it."""

    #: the names it set that look like typos of known ones (also ``Warning`` headers)
    warnings: list[str] = []


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


class IdleCounterOut(BaseModel):
    """A counter at zero that nothing references."""

    partition: str
    #: ``queue``, ``user``, ``group`` or ``quota``
    kind: str
    queue: str
    resource: str
    #: the user, group or ResourceQuota; null for a queue counter
    name: str | None = None


class PruneOut(BaseModel):
    """What ``POST /v1/prune`` found (``applied``: and deleted)."""

    applied: bool
    counters: list[IdleCounterOut]


class ReservationListOut(BaseModel):
    """Reservations that match, oldest first; ``more``: others match beyond ``limit``."""

    reservations: list[ReservationOut]
    more: bool


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
