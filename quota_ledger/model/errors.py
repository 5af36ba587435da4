"""The one exception tree of quota-ledger.

Every error a caller can see is a :class:`QuotaLedgerError`. A class's docstring is its
default message; the facts a program needs are attributes, never parsed out of the text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path

    from quota_ledger.model.values import ConfigProblem, ReservationState, Violation


class QuotaLedgerError(Exception):
    """A quota-ledger operation failed."""

    def __init__(self, message: str | None = None, **details: Any) -> None:
        self.details = details
        super().__init__(message or (self.__doc__ or "").strip())


class InvalidRequest(QuotaLedgerError):
    """The request is malformed; nothing was changed."""

    def __init__(self, message: str | None = None, *, field: str | None = None) -> None:
        self.field = field
        super().__init__(message, field=field)


class InvalidQuantity(InvalidRequest):
    """A resource quantity is not a valid non-negative Kubernetes quantity."""

    def __init__(self, resource: str, text: str, reason: str) -> None:
        self.resource = resource
        self.text = text
        self.reason = reason
        super().__init__(f"invalid quantity {text!r} for resource {resource!r}: {reason}", field=resource)


class OverQuota(QuotaLedgerError):
    """The request would exceed one or more limits; nothing was reserved."""

    def __init__(self, violations: Sequence[Violation]) -> None:
        self.violations = list(violations)
        parts = "; ".join(v.describe() for v in self.violations)
        super().__init__(f"over quota: {parts}")


class WaitTimeout(OverQuota):
    """A request that waited for capacity (``reserve(wait=...)``) was not granted before its
    wait ran out; it left the line (its reservation ended ``expired``) and holds nothing.
    ``violations`` are the limits that still stopped it when it was last tried."""

    def __init__(self, reservation_id: str, violations: Sequence[Violation]) -> None:
        super().__init__(violations)
        self.reservation_id = reservation_id
        self.args = (f"waited in vain for capacity: {self.args[0]}",)


class UsageUnderflow(QuotaLedgerError):
    """The release is larger than what is in use; nothing was released."""

    def __init__(self, partition: str, queue: str, shortfalls: dict[str, tuple[int, int]]) -> None:
        self.partition = partition
        self.queue = queue
        #: resource -> (in_use, requested)
        self.shortfalls = dict(shortfalls)
        # Imported here: the quantity grammar raises errors of this module.
        from quota_ledger.model.quantity import format_human

        parts = ", ".join(
            f"{res}: in use {format_human(res, in_use)}, release {format_human(res, req)}"
            for res, (in_use, req) in shortfalls.items()
        )
        super().__init__(f"cannot release more than is in use at {queue}: {parts}")


class CounterOverflow(QuotaLedgerError):
    """A usage counter would exceed the 64-bit range; nothing was changed."""

    def __init__(self, scope: str, resource: str) -> None:
        self.scope = scope
        self.resource = resource
        super().__init__(f"usage counter for {resource!r} at {scope} would overflow 2^63-1")


class IdempotencyConflict(QuotaLedgerError):
    """The idempotency key was already used for a different request."""

    def __init__(self, partition: str, key: str, reservation_id: str | None) -> None:
        self.partition = partition
        self.key = key
        #: None when the caller may not learn which reservation holds the key
        self.reservation_id = reservation_id
        owner = "another reservation" if reservation_id is None else f"reservation {reservation_id}"
        super().__init__(
            f"key {key!r} in partition {partition!r} already belongs to {owner} with a different request"
        )


class ReservationNotFound(QuotaLedgerError):
    """No reservation has this id."""

    def __init__(self, reservation_id: str) -> None:
        self.reservation_id = reservation_id
        super().__init__(f"reservation {reservation_id} not found")


class ReservationIdTooShort(InvalidRequest):
    """A reservation id prefix is too short to name one reservation."""

    def __init__(self, prefix: str, minimum: int) -> None:
        self.prefix = prefix
        self.minimum = minimum
        super().__init__(
            f"reservation id prefix {prefix!r} is too short: give at least {minimum} characters",
            field="id",
        )


class AmbiguousReservationId(InvalidRequest):
    """A reservation id prefix matches more than one reservation."""

    def __init__(self, prefix: str, candidates: Sequence[str], *, more: bool = False) -> None:
        self.prefix = prefix
        #: the matching ids (the first few when ``more``)
        self.candidates = list(candidates)
        self.more = more
        listed = ", ".join(self.candidates) + (", ..." if more else "")
        super().__init__(f"reservation id prefix {prefix!r} is ambiguous: {listed}", field="id")


class ReservationStateError(QuotaLedgerError):
    """The reservation is not in a state that allows this operation."""

    def __init__(self, reservation_id: str, state: ReservationState, operation: str) -> None:
        self.reservation_id = reservation_id
        self.state = state
        self.operation = operation
        super().__init__(f"cannot {operation} reservation {reservation_id}: it is {state.value}")


class UnknownResource(InvalidRequest):
    """The request names a resource no limit of its partition names, and the partition refuses
    unknown names (``unknownnames: refuse``); nothing was changed."""

    def __init__(
        self, partition: str, resources: Sequence[str], suggestions: Mapping[str, str], message: str
    ) -> None:
        self.partition = partition
        #: the resources no limit of the partition names
        self.resources = list(resources)
        #: resource -> the closest name the partition limits, where one is close
        self.suggestions = dict(suggestions)
        super().__init__(f"{message}; partition {partition} refuses unknown names", field="resources")


class UnknownQueue(InvalidRequest):
    """The request names a queue outside every configured one, and the partition refuses
    unknown names (``unknownnames: refuse``); nothing was changed."""

    def __init__(self, partition: str, queue: str, suggestion: str | None, message: str) -> None:
        self.partition = partition
        self.queue = queue
        #: the closest configured queue, where one is close
        self.suggestion = suggestion
        super().__init__(f"{message}; partition {partition} refuses unknown names", field="queue")


class InvalidCommit(InvalidRequest):
    """The partial commit names resources or amounts that were not reserved."""


class DatabaseUnavailable(QuotaLedgerError):
    """The database could not be reached or kept failing; retry later."""


class DatabaseUnreachable(DatabaseUnavailable):
    """No connection to the database could be opened."""

    def __init__(
        self, where: str, reason: str, *, permanent: bool, attempts: int, seconds: float | None = None
    ) -> None:
        #: ``user@host:port/database``: never the password
        self.where = where
        #: the driver's reason: ``connection refused``, ``password authentication failed ...``
        self.reason = reason
        #: retrying cannot fix it (authentication failed, no such database): fix the URL
        self.permanent = permanent
        self.attempts = attempts
        #: the retry budget in seconds, when the clock rather than the attempts stopped it
        self.seconds = seconds
        if permanent:
            tail = "retrying cannot fix this: check the URL and the credentials"
        else:
            tail = f"gave up after {attempts} attempt{'s' * (attempts != 1)}"
            if seconds is not None:
                tail += f" in {seconds:g} s"
        super().__init__(f"cannot connect to {where}: {reason}; {tail}")


class SchemaNotReady(QuotaLedgerError):
    """The ledger tables are missing or outdated: run `quota-ledger db upgrade`."""


class ConfigError(InvalidRequest):
    """The queue configuration is invalid; nothing was applied."""

    def __init__(self, problems: Sequence[ConfigProblem]) -> None:
        self.problems = list(problems)
        parts = "; ".join(p.describe() for p in self.problems)
        super().__init__(f"invalid configuration: {parts}", field="config")


#: how a message names each known owner of a queue's limits (the value of its property)
_OWNERS = {"keystone": "Keystone"}


class ManagedQueue(QuotaLedgerError):
    """The queue's limits are owned outside the ledger; nothing was changed."""

    def __init__(self, queue: str, owned: str, manager: str) -> None:
        #: the queue whose limits were to change
        self.queue = queue
        #: the owned queue: ``queue`` itself or the configured queue above it
        self.owned = owned
        #: what owns it, as the queue property says: ``keystone``
        self.manager = manager
        name = _OWNERS.get(manager, manager)
        where = "" if owned == queue else f" (under {owned})"
        super().__init__(
            f"the limits of queue {queue}{where} come from {name}: change them in {name}, "
            "the next sync would undo a local change"
        )


class NotFound(QuotaLedgerError):
    """The named object does not exist."""


class UserNotFound(NotFound):
    """No usage or limit is tracked for this user."""

    def __init__(self, user: str) -> None:
        self.user = user
        super().__init__(f"user {user!r} not found")


class GroupNotFound(NotFound):
    """No usage or limit is tracked for this group."""

    def __init__(self, group: str) -> None:
        self.group = group
        super().__init__(f"group {group!r} not found")


class ApplicationNotFound(NotFound):
    """No finished application with this id has a usage summary."""

    def __init__(self, application: str) -> None:
        self.application = application
        super().__init__(f"application {application!r} has no summary")


class InvalidResourceQuota(InvalidRequest):
    """The ResourceQuota (or admission configuration) is invalid; nothing was changed."""

    def __init__(self, errors: Sequence[tuple[str, str]]) -> None:
        #: (field path, message) for every problem, as the API server reports them
        self.errors = list(errors)
        text = "; ".join(f"{f}: {m}" for f, m in self.errors)
        super().__init__(f"invalid ResourceQuota: {text}", field=self.errors[0][0])


class MissingCoveringQuota(QuotaLedgerError):
    """The admission configuration demands a covering quota this namespace does not have."""

    def __init__(self, namespace: str, resources: Sequence[str], scopes: Sequence[str]) -> None:
        self.namespace = namespace
        #: limited resource names no quota covers
        self.resources = list(resources)
        #: limited scopes no quota covers, as Kubernetes prints them: ``{PriorityClass In [a]}``
        self.scopes = list(scopes)
        parts = []
        if self.resources:
            parts.append(f"insufficient quota to consume: {','.join(self.resources)}")
        if self.scopes:
            parts.append(f"insufficient quota to match these scopes: [{' '.join(self.scopes)}]")
        super().__init__(f"namespace {namespace}: " + "; ".join(parts))


class PodMissingResources(QuotaLedgerError):
    """A matching quota tracks a value some containers do not set."""

    def __init__(self, quota: str, missing: dict[str, list[str]]) -> None:
        self.quota = quota
        #: quota resource name -> containers that do not specify it, both sorted as Kubernetes sorts them
        self.missing = {res: sorted(set(names)) for res, names in sorted(missing.items())}
        parts = "; ".join(f"{res} for: {','.join(names)}" for res, names in self.missing.items())
        super().__init__(f"failed quota: {quota}: must specify {parts}")


class ResourceQuotaNotFound(NotFound):
    """No ResourceQuota has this namespace/name."""

    def __init__(self, key: str) -> None:
        self.key = key
        super().__init__(f"resourcequota {key} not found")


class TooManyResources(InvalidRequest):
    """The request names more resources than the ledger is configured to take; nothing was changed."""

    def __init__(self, where: str, count: int, maximum: int, *, field: str = "resources") -> None:
        #: ``request``, ``limit set`` or ``partition '<name>'``
        self.where = where
        self.count = count
        self.maximum = maximum
        super().__init__(f"a {where} may name at most {maximum} resources, not {count}", field=field)


class LedgerMissing(SchemaNotReady):
    """There is no ledger here yet: run `quota-ledger db upgrade` to create it."""

    def __init__(self, path: Path) -> None:
        #: the SQLite file that does not exist
        self.path = path
        super().__init__(f"no ledger at {path}: run `quota-ledger db upgrade` to create it (or pass --db)")


class RemovesAllLimits(QuotaLedgerError):
    """The configuration removes every limit of a partition; nothing was applied.

    Apply it with an explicit confirmation if that is meant.
    """

    def __init__(self, partitions: Sequence[str]) -> None:
        #: the partitions that have limits now and would have none
        self.partitions = list(partitions)
        names = ", ".join(self.partitions)
        super().__init__(
            f"the configuration removes every limit of partition {names}; nothing was applied. "
            "If that is meant, confirm it: `config apply --allow-removing-all`, "
            "`PUT /v1/config?confirm=remove-all` or `apply_config(..., allow_removing_all=True)`"
        )
