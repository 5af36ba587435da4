"""What every part of the engine shares: its state, and how a prepared operation is decided."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Generic, TypeVar

from quota_ledger.driver.core import DbQuotaDriver
from quota_ledger.driver.tx import LedgerTx
from quota_ledger.ledger import configure, group_commit
from quota_ledger.ledger.compiled import CompiledRules
from quota_ledger.ledger.paths import Paths
from quota_ledger.model import validation
from quota_ledger.model.errors import InvalidRequest
from quota_ledger.model.quantity import parse_resources
from quota_ledger.model.values import Reservation

T = TypeVar("T")
DEFAULT_PARTITION = "default"
DEFAULT_TTL = 300.0


@dataclass(frozen=True, slots=True)
class Operation(Generic[T]):
    """A reservation operation whose arguments are checked, ready to be decided
    (:meth:`QuotaEngine.decide`, or many at once :meth:`QuotaEngine.decide_all`)."""

    #: how group commit decides it (or a transaction of its own, without batching)
    request: group_commit.Deciders[Any]
    #: the result from the request's value, once its transaction has committed (may raise)
    finish: Callable[[Any], T] | None = None
    #: it may free capacity (what frees it: ``rollback``, ``commit``, ``release``): the
    #: partition's waiting line is passed over after it
    frees: str | None = None


def _outcome(call: Callable[[], T]) -> T | Exception:
    """The call's result, or the error it raised (one operation of many)."""
    try:
        return call()
    except Exception as error:  # delivered as that operation's outcome
        return error


class EngineBase:
    """The state :class:`QuotaEngine` sets up and its parts use, and deciding operations.

    The parts (reservations, configuration, Kubernetes objects, usage, maintenance) are mixins
    of this class; :class:`QuotaEngine` combines them and sets these attributes.
    """

    driver: DbQuotaDriver
    default_ttl: float
    #: how many resources a request, a limit set and a partition may name
    bounds: validation.Bounds
    #: the newest configuration compiled, shared by this engine's operations
    rules: CompiledRules
    #: with ``batching``: the queue and flusher that decide many requests per transaction
    group_commit: group_commit.GroupCommit | None
    #: which decider decides each operation
    paths: Paths

    def decide(self, operation: Operation[T]) -> T:
        """Decide a prepared operation (``prepare_*``): in a transaction of its own, or with
        batching in the next batch; its result, or raises its error."""
        request = operation.request
        passes = True
        if self.group_commit is None:
            if request.alone is not None:
                value = request.alone()
            elif operation.frees is not None:
                value, passes = self._free(request.step, operation.frees)
            else:
                value = self.driver.run(request.step)
        else:
            value = self.group_commit.run(
                request.step, request.order, request.by_function, request.alone, request.together
            )
        result = value if operation.finish is None else operation.finish(value)
        if passes and operation.frees is not None and isinstance(result, Reservation):
            self._freed(result.partition, operation.frees)
        return result

    def decide_all(self, operations: Sequence[Operation[T]]) -> list[T | Exception]:
        """Decide many prepared operations (``prepare_*``) from this thread, each exactly as
        :meth:`decide` would; each one's result or error, in order. With batching they are
        queued together and decided in shared transactions (no thread each); without, one
        after another."""
        if self.group_commit is None:
            return [_outcome(partial(self.decide, operation)) for operation in operations]
        values = self.group_commit.run_many([operation.request for operation in operations])
        results = [
            value
            if isinstance(value, Exception) or operation.finish is None
            else _outcome(partial(operation.finish, value))
            for operation, value in zip(operations, values, strict=True)
        ]
        for partition, reason in sorted(
            {
                (result.partition, operation.frees)
                for operation, result in zip(operations, results, strict=True)
                if operation.frees is not None and isinstance(result, Reservation)
            }
        ):
            self._freed(partition, reason)
        return results

    def _free(self, step: Callable[[LedgerTx], T], reason: str) -> tuple[T, bool]:
        """Run ``step``, which may free capacity (``reason``), in a transaction of its own; its
        value, and whether the line of the partition it freed capacity in still needs a pass
        (see :mod:`.waiting`, which may grant in the same transaction)."""
        return self.driver.run(step), True

    def _freed(self, partition: str | None, reason: str) -> None:
        """Capacity may have been freed in ``partition`` (None: in any partition): the engine
        grants what now fits of its waiting line (see :mod:`.waiting`)."""

    @staticmethod
    def _bounded(resources: object, bound: Callable[[Mapping[str, Any]], None]) -> dict[str, int]:
        """Parse a resource mapping once its size is within ``bound`` (counted before parsing)."""
        if not isinstance(resources, Mapping):
            raise InvalidRequest("resources must map resource names to quantities", field="resources")
        bound(resources)
        # A request's amounts are exact: a fraction of a unit is refused, not rounded up.
        return parse_resources(resources, exact=True)

    def _apply(self, tx: LedgerTx, edit: configure.Edit | None = None, **kw: Any) -> int:
        return configure.apply(tx, edit, compiled=self.rules.remember, bounds=self.bounds, **kw)
