"""The frozen values the public API returns."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from quota_ledger.model.quantity import KUBE_CPU_NAMES, format_human


class ReservationState(enum.StrEnum):
    """Where a reservation is in its life: ``pending`` until it is resolved exactly once."""

    PENDING = "pending"
    #: in line for capacity (``reserve(wait=...)``): holds nothing until it is granted, then
    #: ``pending``; ``rolled_back`` when cancelled, ``expired`` when its wait runs out
    WAITING = "waiting"
    COMMITTED = "committed"
    ROLLED_BACK = "rolled_back"
    EXPIRED = "expired"


@dataclass(frozen=True, kw_only=True, slots=True)
class Reservation:
    """A claim on resources in one queue, held until it is committed, rolled back or expires."""

    id: str
    state: ReservationState
    partition: str
    queue: str
    #: resource -> reserved amount in base units (milli-cores for ``vcore``/``cpu``)
    resources: dict[str, int]
    created_at: datetime
    expires_at: datetime
    key: str | None = None
    user: str | None = None
    groups: tuple[str, ...] = ()
    application: str | None = None
    priority_class: str | None = None
    #: resource -> amount that became in-use usage; set once committed
    committed: dict[str, int] | None = None
    resolved_at: datetime | None = None
    #: when a committed reservation was released as a whole (``release_reservation``)
    released_at: datetime | None = None
    #: what the request named that no configuration knows (a likely typo); set on the result of
    #: a reserve only, never stored
    warnings: tuple[str, ...] = ()
    #: the priority it asked with: of two requests waiting in one partition, the higher is
    #: granted first
    priority: int = 0
    #: while it waits, its place in its partition's line (1 = the next to be tried); else None
    position: int | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Usage:
    """One resource's usage of a queue's whole subtree, and the queue's own limit on it."""

    in_use: int
    reserved: int
    #: None when the queue sets no limit on this resource
    limit: int | None

    @property
    def available(self) -> int | None:
        """``limit - (in_use + reserved)``, or None when unlimited (may be negative)."""
        return None if self.limit is None else self.limit - (self.in_use + self.reserved)


@dataclass(frozen=True, kw_only=True, slots=True)
class Violation:
    """One limit a request would break."""

    scope: str
    resource: str
    limit: int
    in_use: int
    reserved: int
    requested: int
    partition: str = "default"
    #: ``queue`` for queue limits; ``user`` or ``group`` for the limit of :attr:`name` at scope
    kind: str = "queue"
    name: str | None = None

    @property
    def available(self) -> int:
        """``limit - (in_use + reserved)``: what may still be requested (negative when over)."""
        return self.limit - (self.in_use + self.reserved)

    @property
    def shortfall(self) -> int:
        """How much the request asks for beyond what is available: ``requested - available``."""
        return self.requested - self.available

    def describe(self) -> str:
        """One line in the resource's own units, as ``kubectl describe quota`` prints:
        ``memory at root.a: limit 8Gi, in use 0, reserved 0, requested 9Gi, available 8Gi``."""
        if self.kind == "quota":
            where = f"{self.resource} in quota {self.scope}"
            milli: bool | None = self.resource in KUBE_CPU_NAMES
        else:
            who = f" for {self.kind} {self.name}" if self.name is not None else ""
            where = f"{self.resource} at {self.scope}{who}"
            milli = None

        def human(units: int) -> str:
            return format_human(self.resource, units, milli=milli)

        return (
            f"{where}: limit {human(self.limit)}, in use {human(self.in_use)}, "
            f"reserved {human(self.reserved)}, requested {human(self.requested)}, "
            f"available {human(self.available)}"
        )


class HolderKind(enum.StrEnum):
    """Who a :class:`Holder` is."""

    #: a named application (its id is the holder's name)
    APPLICATION = "application"
    #: a user's reservations that name no application
    USER = "user"
    #: a queue's reservations that name neither a user nor an application
    QUEUE = "queue"


@dataclass(frozen=True, kw_only=True, slots=True)
class Holder:
    """One of the largest holders of what a limit counts, in one resource."""

    kind: HolderKind
    name: str
    #: the queue it holds in
    queue: str
    in_use: int
    reserved: int

    @property
    def held(self) -> int:
        """``in_use + reserved``."""
        return self.in_use + self.reserved


@dataclass(frozen=True, kw_only=True, slots=True)
class Blocker:
    """A limit that stops a request, with the largest holders of what it counts (at most five,
    the largest first)."""

    violation: Violation
    holders: tuple[Holder, ...] = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class Explanation:
    """What :meth:`QuotaEngine.explain` says of a request, without writing anything: whether
    :meth:`QuotaEngine.reserve` would admit it now and, if not, every limit that stops it."""

    admitted: bool
    #: one for each limit that stops the request (none when admitted), in the order of
    #: :attr:`OverQuota.violations`
    blockers: tuple[Blocker, ...] = ()
    #: for a request that would wait for capacity (``wait=``), how many waiting requests of its
    #: partition would be tried before it; None when it would not wait
    ahead: int | None = None
    #: what the requests :attr:`ahead` ask for together, resource by resource
    ahead_needs: dict[str, int] = field(default_factory=dict)

    @property
    def violations(self) -> list[Violation]:
        """The limits that stop the request: what :class:`OverQuota` would carry."""
        return [b.violation for b in self.blockers]

    @property
    def holders(self) -> dict[Violation, tuple[Holder, ...]]:
        """The largest holders of what each violated limit counts."""
        return {b.violation: b.holders for b in self.blockers}


class Charged(enum.StrEnum):
    """How :meth:`QuotaEngine.charge_pod` charged a pod."""

    #: its pending reservation (the admission webhook's) was committed
    COMMITTED = "committed"
    #: the ledger held nothing for it: reserved and committed at once, limits not checked
    CHARGED = "charged"
    #: it was charged before: nothing changed
    ALREADY = "already"


@dataclass(frozen=True, kw_only=True, slots=True)
class PodCharge:
    """What :meth:`QuotaEngine.charge_pod` did: the pod's committed reservation, how, and the
    limits it went over (only when :attr:`how` is ``CHARGED``)."""

    reservation: Reservation
    how: Charged
    overruns: tuple[Violation, ...] = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class Drift:
    """A usage counter that disagrees with what the ledger's history says it should be, or
    (``scope_type`` ``commit`` or ``release``) the journal's entries of one kind for one
    reservation (``name``) that disagree with what the reservation says was committed."""

    partition: str
    scope_type: str
    scope: str
    resource: str
    in_use: int
    reserved: int
    expected_in_use: int
    expected_reserved: int
    fixed: bool = field(default=False)
    #: the user or group of a ``user``/``group`` counter, the reservation of a journal check
    name: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class ConfigProblem:
    """One reason a queue configuration is refused, with where it was found."""

    partition: str
    #: full queue path (``root.a.b``), or "" for partition-level problems
    queue: str
    #: the limit's description, or the user/group/resource it concerns; "" when none
    limit: str
    message: str

    def describe(self) -> str:
        if not (self.partition or self.queue or self.limit):
            return self.message  # the whole document: its YAML, its top-level keys
        where = f"partition {self.partition!r}"
        if self.queue:
            where += f", queue {self.queue}"
        if self.limit:
            where += f", limit {self.limit!r}"
        return f"{where}: {self.message}"


@dataclass(frozen=True, slots=True)
class StoredReservation:
    """A reservation as stored, with the hash that identifies its request."""

    reservation: Reservation
    request_hash: str
    #: Kubernetes quota usage and scope attributes ({"usage": ..., "scopes": ...}); None if unknown
    kube: dict[str, Any] | None = None


class LimitsVersion(int):
    """The configuration version :meth:`QuotaEngine.set_limits` leaves in force: an ``int``, as
    it always was, that also carries the call's ``warnings`` (as :attr:`Reservation.warnings`
    does for a reserve): the names it set that look like typos of known ones."""

    #: what the call named that looks like a typo of a known name; never stored
    warnings: tuple[str, ...]

    def __new__(cls, version: int, warnings: tuple[str, ...] = ()) -> LimitsVersion:
        made = super().__new__(cls, version)
        made.warnings = tuple(warnings)
        return made

    def __repr__(self) -> str:
        return f"LimitsVersion({int(self)}, warnings={self.warnings!r})"


@dataclass(frozen=True, kw_only=True, slots=True)
class IdleCounter:
    """A usage counter at zero that nothing references: what ``prune`` removes."""

    partition: str
    #: ``queue`` (a queue's own usage), or ``user``, ``group`` or ``quota`` (a limit's counter)
    kind: str
    queue: str
    resource: str
    #: the user, the group or the ResourceQuota (``namespace/name``); None for a queue counter
    name: str | None = None
