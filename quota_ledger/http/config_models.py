"""The JSON shapes of ``POST /v1/config/diff`` (see docs/configuration-changes.md)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class LimitChangeOut(BaseModel):
    """One limit added (``old`` null), removed (``new`` null) or changed; base units."""

    partition: str
    kind: str = Field(description="queue, user or group")
    name: str | None = Field(description="the user or group (* for the wildcard entry); null for a queue")
    queue: str
    resource: str = Field(description="a resource, or applications for maxapplications")
    old: int | None
    new: int | None


class LimitChangesOut(BaseModel):
    added: list[LimitChangeOut]
    removed: list[LimitChangeOut]
    changed: list[LimitChangeOut]


class OverLimitOut(BaseModel):
    """A queue, user or group whose current usage would be over its new limit."""

    partition: str
    kind: str = Field(description="queue, user or group")
    name: str | None = Field(description="the user or group; null for a queue")
    queue: str
    resource: str
    in_use: int
    reserved: int
    limit: int = Field(description="the limit under the new configuration")
    old_limit: int | None = Field(description="the limit in force now; null when there is none")


class ConfigDiffOut(BaseModel):
    """A dry run of ``PUT /v1/config`` against the version in force."""

    version: int = Field(description="the version in force, compared against")
    identical: bool = Field(description="applying it would change nothing and make no version")
    limits: LimitChangesOut
    over_limit: list[OverLimitOut]
    removes_all_limits: list[str] = Field(
        description="partitions that have limits now and would have none: PUT needs ?confirm=remove-all"
    )
