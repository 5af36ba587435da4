"""QuotaEngine: the one object service code holds. It decides; the driver reads and writes."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import Any, Generic, TypeVar

from sqlalchemy.engine import URL

from quota_ledger.config import reports
from quota_ledger.config.diff import ConfigDiff
from quota_ledger.config.rules import PartitionRules
from quota_ledger.driver.core import DbQuotaDriver
from quota_ledger.driver.tx import LedgerTx
from quota_ledger.kube import admission as kube_admission
from quota_ledger.kube import namespaces, pods
from quota_ledger.kube import quotas as kube_quotas
from quota_ledger.ledger import (
    audit,
    batches,
    configure,
    expire,
    group_commit,
    queue_limits,
    reads,
    release,
    reserve,
    resolve,
    resource_quotas,
)
from quota_ledger.ledger.reserve import Request as ReserveRequest
from quota_ledger.ledger.rules import CompiledRules
from quota_ledger.model import arguments, validation
from quota_ledger.model.errors import (
    ApplicationNotFound,
    GroupNotFound,
    InvalidRequest,
    ReservationNotFound,
    UserNotFound,
)
from quota_ledger.model.quantity import APPLICATIONS, parse_limits, parse_resources
from quota_ledger.model.tracking import AppState
from quota_ledger.model.values import ConfigProblem, Drift, Reservation, Usage

T = TypeVar("T")
DEFAULT_PARTITION = "default"
DEFAULT_TTL = 300.0


@dataclass(frozen=True, slots=True)
class Operation(Generic[T]):
    """A reservation operation whose arguments are checked, ready to be decided
    (:meth:`QuotaEngine.decide`, or many at once :meth:`QuotaEngine.decide_all`)."""

    #: how group commit decides it (or a transaction of its own, without batching)
    request: group_commit.Request[Any]
    #: the result from the request's value, once its transaction has committed (may raise)
    finish: Callable[[Any], T] | None = None


def _outcome(call: Callable[[], T]) -> T | Exception:
    """The call's result, or the error it raised (one operation of many)."""
    try:
        return call()
    except Exception as error:  # delivered as that operation's outcome
        return error


class QuotaEngine:
    """Reserve resources against queue limits, then commit or roll back.

    Every method is one database transaction (retried as a whole on transient failures) and
    is all-or-nothing: it either applies completely or raises and changes nothing. With
    ``batching=True``, concurrent reservations, commits, rollbacks and releases of reservations
    are decided together, up to ``max_batch`` per transaction, each with the outcome it would
    have had alone (see :mod:`quota_ledger.ledger.group_commit`).
    """

    def __init__(
        self,
        driver: DbQuotaDriver,
        *,
        default_ttl: float = DEFAULT_TTL,
        max_resources_per_request: int = validation.DEFAULT_MAX_RESOURCES_PER_REQUEST,
        max_resources_per_limit_set: int = validation.DEFAULT_MAX_RESOURCES_PER_LIMIT_SET,
        max_resources_per_partition: int = validation.DEFAULT_MAX_RESOURCES_PER_PARTITION,
        batching: bool = False,
        max_batch: int = group_commit.DEFAULT_MAX_BATCH,
    ) -> None:
        validation.flag(batching, "batching")
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise InvalidRequest("max_batch must be a positive integer", field="max_batch")
        self.driver = driver
        self.default_ttl = validation.ttl(default_ttl)
        #: how many resources a request, a limit set and a partition may name
        self.bounds = validation.Bounds(
            resources_per_request=max_resources_per_request,
            resources_per_limit_set=max_resources_per_limit_set,
            resources_per_partition=max_resources_per_partition,
        )
        #: the newest configuration compiled, shared by this engine's operations
        self.rules = CompiledRules()
        #: with ``batching``: the queue and flusher that decide many requests per transaction
        self.group_commit = group_commit.GroupCommit(driver, max_batch) if batching else None

    @classmethod
    def from_url(
        cls,
        url: str | URL | Sequence[str | URL],
        *,
        read_urls: Sequence[str | URL] | None = None,
        default_ttl: float = DEFAULT_TTL,
        pool_size: int = 10,
        echo: bool = False,
        retry_attempts: int = 10,
        retry_seconds: float = 15.0,
        backoff_cap: float = 3.0,
        galera_sync_wait: int = 1,
        max_resources_per_request: int = validation.DEFAULT_MAX_RESOURCES_PER_REQUEST,
        max_resources_per_limit_set: int = validation.DEFAULT_MAX_RESOURCES_PER_LIMIT_SET,
        max_resources_per_partition: int = validation.DEFAULT_MAX_RESOURCES_PER_PARTITION,
        batching: bool = False,
        max_batch: int = group_commit.DEFAULT_MAX_BATCH,
    ) -> QuotaEngine:
        """An engine on ``postgresql+psycopg://``, ``mysql+pymysql://`` or ``sqlite:///`` URLs.

        ``url`` is one URL, or a list of the writer candidates in order of preference: the
        hosts of a PostgreSQL primary and its standbys (a libpq multi-host URL is fine too), or
        the nodes of a Galera cluster, one of which writes at a time. ``read_urls`` are
        replicas for reads that may be slightly stale. One operation is retried at most
        ``retry_attempts`` times and ``retry_seconds`` long, waits growing up to
        ``backoff_cap`` seconds; the defaults ride out a failover of about 9 s. On Galera the
        writer's sessions set ``wsrep_sync_wait = galera_sync_wait`` (0: not at all). See
        :class:`DbQuotaDriver` and :mod:`quota_ledger.driver.topology`.

        ``max_resources_per_*`` bound how many resources one request, one limit set and one
        partition may name (:class:`TooManyResources` beyond them).

        ``batching=True`` decides concurrent reservations, commits, rollbacks and releases of
        reservations together, up to ``max_batch`` of them per transaction (group commit: see
        :mod:`quota_ledger.ledger.group_commit`).
        """
        return cls(
            DbQuotaDriver.from_url(
                url,
                read_urls=read_urls,
                pool_size=pool_size,
                echo=echo,
                retry_attempts=retry_attempts,
                retry_seconds=retry_seconds,
                backoff_cap=backoff_cap,
                galera_sync_wait=galera_sync_wait,
            ),
            default_ttl=default_ttl,
            max_resources_per_request=max_resources_per_request,
            max_resources_per_limit_set=max_resources_per_limit_set,
            max_resources_per_partition=max_resources_per_partition,
            batching=batching,
            max_batch=max_batch,
        )

    def migrate(self, revision: str = "head") -> None:
        """Upgrade the schema with Alembic (to ``head`` by default). Safe to call repeatedly."""
        from quota_ledger.driver import migrate

        with self.driver.translated():
            migrate.upgrade(self.driver.engine, revision)
        if self.group_commit is not None:
            self.group_commit.schema_changed()

    def close(self) -> None:
        """Release all database connections. With batching, the requests already queued are
        decided first; later calls raise :class:`DatabaseUnavailable`."""
        if self.group_commit is not None:
            self.group_commit.close()
        self.driver.dispose()

    @property
    def batch_stats(self) -> group_commit.BatchStats:
        """How many batches and requests group commit has decided (zeros without batching)."""
        return self.group_commit.stats if self.group_commit is not None else group_commit.BatchStats()

    def __enter__(self) -> QuotaEngine:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- limits ------------------------------------------------------------------------------
    def set_limits(
        self, queue: str, resources: Mapping[str, Any], *, partition: str = DEFAULT_PARTITION
    ) -> int:
        """Set the named resources' limits on ``queue``'s subtree; None removes a limit.

        Resources not named keep their limits. This edits the queue's ``resources.max`` in the
        configuration as a new version, refused exactly when :meth:`apply_config` would refuse
        the edited configuration; root's limits are the partition's capacity, kept next to it.
        On a configured queue it checks and changes only that queue (its path and subtree), so
        its cost does not grow with the configuration. A queue not configured yet is added the
        same way (with the levels missing above it) in a configured partition without placement
        rules; otherwise through a whole new version. Lowering a limit below current usage is
        allowed: nothing is evicted, new reservations are refused until usage drops. Returns the
        new configuration version (the one in force when nothing changes).
        """
        validation.partition(partition)
        validation.queue(queue)
        if isinstance(resources, Mapping):
            self.bounds.limit_set(resources)
        wanted = parse_limits(resources)
        if APPLICATIONS in wanted:
            raise InvalidRequest("set maxapplications in the configuration", field=APPLICATIONS)
        return self.driver.run(
            lambda tx: queue_limits.set_limits(tx, self.rules, partition, queue, wanted, self.bounds)
        )

    # -- configuration -----------------------------------------------------------------------
    def apply_config(self, source: Any, *, allow_removing_all: bool = False) -> int:
        """Apply a YuniKorn queue configuration (YAML text, a dict or a path) to every partition.

        All or nothing, in one transaction: on any problem raises :class:`ConfigError` listing
        all of them and changes nothing. Reservations keep flowing and see either the old or
        the new limits. Returns the new version; a configuration identical to the one in force
        changes nothing and returns the current version. A configuration that would leave a
        partition that has limits without any (``partitions: []``, say) raises
        :class:`RemovesAllLimits` unless ``allow_removing_all=True``. What :meth:`config`
        returns, or ``{"version": n, "config": {...}}`` as the service serves it, is accepted.
        """
        source = arguments.read_path(source)
        allow = validation.flag(allow_removing_all, "allow_removing_all")
        edit = configure.replace_with(source)
        return self.driver.run(lambda tx: self._apply(tx, edit, allow_removing_all=allow))

    def diff_config(self, source: Any) -> ConfigDiff:
        """What :meth:`apply_config` would do with ``source`` now, changing nothing: the limits
        added, removed and changed, and every queue, user and group whose current usage would
        then be over its limit. Raises :class:`ConfigError` as applying it would."""
        source = arguments.read_path(source)
        return self.driver.run(
            lambda tx: configure.diff(tx, source, self.bounds), isolation="REPEATABLE READ"
        )

    def validate_config(self, source: Any) -> list[ConfigProblem]:
        """Every problem of a configuration; changes nothing (empty list: it would apply)."""
        return configure.check(arguments.read_path(source), self.bounds)[1]

    def apply_namespace(self, manifest: Any, *, partition: str = DEFAULT_PARTITION) -> str:
        """Place a Kubernetes Namespace (dict or YAML, as Kubernetes serves it) on its queue.

        ``root.<name>``, or under the queue named by ``yunikorn.apache.org/parentqueue``; the
        queue's max comes from ``yunikorn.apache.org/namespace.quota`` (or the deprecated
        ``namespace.max.cpu``/``.max.memory``) and is applied as a new configuration version.
        Returns the queue path.
        """
        validation.partition(partition)
        found = namespaces.placement(manifest)
        if found.max is not None:
            self.bounds.limit_set(found.max, namespaces.QUOTA)
        edit = configure.set_namespace_max(partition, found.queue, found.max)

        def work(tx: LedgerTx) -> str:
            self._apply(tx, edit)
            tx.place_namespace(partition, found.namespace, found.queue, tx.db_now())
            return found.queue

        return self.driver.run(work)

    def namespace_queue(self, namespace: str, *, partition: str = DEFAULT_PARTITION) -> str:
        """The queue a namespace's reservations go to (``root.<namespace>`` if never placed)."""
        validation.partition(partition)
        name = validation.namespace(namespace)
        found = self.driver.run(lambda tx: tx.namespace_queue(partition, name))
        return found if found is not None else f"root.{name}"

    def config(self) -> dict[str, Any]:
        """The configuration in force, normalized (a dict :meth:`apply_config` accepts)."""
        return self.driver.run(lambda tx: tx.load_config(tx.config_version())[0])

    def config_version(self) -> int:
        """The version of the configuration in force (0: nothing applied yet)."""
        return self.driver.run(lambda tx: tx.config_version())

    def limits(self, *, partition: str = DEFAULT_PARTITION) -> dict[str, dict[str, int]]:
        """Every limit in the partition: ``{queue: {resource: limit}}``."""
        validation.partition(partition)
        return self.driver.run(lambda tx: reads.limits(tx, partition), read_only=True)

    # -- reservations ------------------------------------------------------------------------
    def reserve(
        self,
        queue: str,
        resources: Mapping[str, Any],
        *,
        partition: str = DEFAULT_PARTITION,
        user: str | None = None,
        groups: Iterable[str] = (),
        application: str | None = None,
        priority_class: str | None = None,
        ttl: float | timedelta | None = None,
        key: str | None = None,
        terminating: bool = False,
        best_effort: bool | None = None,
        cross_namespace_affinity: bool = False,
    ) -> Reservation:
        """Reserve ``resources`` in ``queue`` if every limit on the way to root allows it.

        Raises :class:`OverQuota` listing every limit that would be broken. With ``key``, a
        repeated call returns the original reservation (in whatever state it is now).
        ``priority_class``, ``terminating``, ``best_effort`` (default: no vcore/cpu or memory
        requested) and ``cross_namespace_affinity`` are the Kubernetes scope attributes that
        ResourceQuotas in the queue's namespace match on.
        """
        return self.decide(
            self.prepare_reserve(
                queue,
                resources,
                partition=partition,
                user=user,
                groups=groups,
                application=application,
                priority_class=priority_class,
                ttl=ttl,
                key=key,
                terminating=terminating,
                best_effort=best_effort,
                cross_namespace_affinity=cross_namespace_affinity,
            )
        )

    def prepare_reserve(
        self,
        queue: str,
        resources: Mapping[str, Any],
        *,
        partition: str = DEFAULT_PARTITION,
        user: str | None = None,
        groups: Iterable[str] = (),
        application: str | None = None,
        priority_class: str | None = None,
        ttl: float | timedelta | None = None,
        key: str | None = None,
        terminating: bool = False,
        best_effort: bool | None = None,
        cross_namespace_affinity: bool = False,
    ) -> Operation[Reservation]:
        """:meth:`reserve` checked but not decided yet (:meth:`decide_all`); raises what
        :meth:`reserve` raises for its arguments."""
        validation.partition(partition)
        validation.queue(queue)
        amounts = self._bounded(resources, self.bounds.request)
        if not amounts:
            raise InvalidRequest("a reservation names at least one resource (RES=QTY)", field="resources")
        positive = {res: amount for res, amount in amounts.items() if amount > 0}
        usage, derived = pods.usage_of_resources(positive)
        validation.flag(terminating, "terminating")
        validation.flag(cross_namespace_affinity, "cross_namespace_affinity")
        if best_effort is not None and not isinstance(best_effort, bool):
            raise InvalidRequest("best_effort must be True, False or None", field="best_effort")
        scopes = pods.PodScopes(
            priority_class=validation.priority_class(priority_class),
            terminating=terminating,
            best_effort=derived.best_effort if best_effort is None else best_effort,
            cross_namespace_affinity=cross_namespace_affinity,
        )
        request = reserve.build(
            partition=partition,
            queue=queue,
            resources=positive,
            user=user,
            groups=groups,
            application=application,
            ttl=ttl,
            default_ttl=self.default_ttl,
            key=key,
            kube={"usage": usage, "scopes": scopes.as_dict()},
            namespace=queue.rsplit(".", 1)[-1],
        )
        return self._reservation(request)

    def reserve_pod(
        self,
        pod: Any,
        *,
        partition: str = DEFAULT_PARTITION,
        ttl: float | timedelta | None = None,
        key: str | None = None,
    ) -> Reservation:
        """Reserve what a v1 Pod (dict or YAML) needs in its namespace's queue.

        Derives the request (containers summed, init containers by the max rule, overhead added;
        cpu in ``vcore`` milli-cores, memory in bytes, extended resources as counts, ``pods: 1``),
        the priority class and scope attributes, the user and groups from the annotation
        ``yunikorn.apache.org/user.info`` and the application from the ``applicationId`` label.
        ``key`` defaults to the pod's ``metadata.uid``.
        """
        return self.decide(self.prepare_reserve_pod(pod, partition=partition, ttl=ttl, key=key))

    def prepare_reserve_pod(
        self,
        pod: Any,
        *,
        partition: str = DEFAULT_PARTITION,
        ttl: float | timedelta | None = None,
        key: str | None = None,
    ) -> Operation[Reservation]:
        """:meth:`reserve_pod` checked but not decided yet (:meth:`decide_all`); reads the
        namespace's queue."""
        validation.partition(partition)
        request = pods.parse_pod(pod)
        self.bounds.request(request.resources, "spec.containers")
        queue = self.namespace_queue(request.namespace, partition=partition)
        checked = reserve.build(
            partition=partition,
            queue=queue,
            resources=request.resources,
            user=request.user,
            groups=request.groups,
            application=request.application,
            ttl=ttl,
            default_ttl=self.default_ttl,
            key=key if key is not None else request.uid,
            kube={"usage": request.usage, "scopes": request.scopes.as_dict()},
            namespace=request.namespace,
            missing={"requests": request.missing_requests, "limits": request.missing_limits},
        )
        return self._reservation(checked)

    def get(self, reservation_id: str) -> Reservation:
        """The reservation with this id, as stored now."""
        wanted = validation.reservation_id(reservation_id)
        found = self.driver.run(lambda tx: tx.find_reservation(wanted))
        if found is None:
            raise ReservationNotFound(wanted)
        return found.reservation

    def get_by_key(self, key: str, *, partition: str = DEFAULT_PARTITION) -> Reservation:
        """The reservation made with this idempotency key."""
        validation.partition(partition)
        name = validation.name(key, "key")
        found = self.driver.run(lambda tx: tx.find_reservation_by_key(partition, name))
        if found is None:
            raise ReservationNotFound(name)
        return found.reservation

    def commit(self, reservation_id: str, resources: Mapping[str, Any] | None = None) -> Reservation:
        """Turn a pending reservation into in-use usage.

        ``resources`` may name less than was reserved (missing resources commit nothing); the
        rest is released in the same transaction. Committing a committed reservation returns
        it; a rolled-back or expired one raises :class:`ReservationStateError`, also when its
        expiry time has passed but no sweep has run yet (it is expired on the spot).
        """
        return self.decide(self.prepare_commit(reservation_id, resources))

    def prepare_commit(
        self, reservation_id: str, resources: Mapping[str, Any] | None = None
    ) -> Operation[Reservation]:
        """:meth:`commit` checked but not decided yet (:meth:`decide_all`)."""
        validation.reservation_id(reservation_id)
        amounts = None if resources is None else self._bounded(resources, self.bounds.request)
        operation_id = str(uuid.uuid4())
        step = partial(
            resolve.commit_general,
            rules=self.rules,
            reservation_id=reservation_id,
            amounts=amounts,
            operation_id=operation_id,
        )
        fast = None
        if amounts is None and self._functions:
            fast = partial(resolve.by_function_in, reservation_id=reservation_id, operation_id=operation_id)
        alone = partial(self._commit_alone, reservation_id, amounts, operation_id)
        request = group_commit.Request(step, fast=fast, alone=alone)
        return Operation(request, resolve.raise_expired)

    def rollback(self, reservation_id: str) -> Reservation:
        """Release a pending reservation. Rolling back twice, or an expired one, returns it;
        rolling back a committed one raises :class:`ReservationStateError`."""
        return self.decide(self.prepare_rollback(reservation_id))

    def prepare_rollback(self, reservation_id: str) -> Operation[Reservation]:
        """:meth:`rollback` checked but not decided yet (:meth:`decide_all`)."""
        validation.reservation_id(reservation_id)
        return Operation(
            group_commit.Request(partial(resolve.rollback, rules=self.rules, reservation_id=reservation_id))
        )

    def decide(self, operation: Operation[T]) -> T:
        """Decide a prepared operation (``prepare_*``): in a transaction of its own, or with
        batching in the next batch; its result, or raises its error."""
        request = operation.request
        if self.group_commit is None:
            value = request.alone() if request.alone is not None else self.driver.run(request.step)
        else:
            value = self.group_commit.run(request.step, request.order, request.fast, request.alone)
        return value if operation.finish is None else operation.finish(value)

    def decide_all(self, operations: Sequence[Operation[T]]) -> list[T | Exception]:
        """Decide many prepared operations (``prepare_*``) from this thread, each exactly as
        :meth:`decide` would; each one's result or error, in order. With batching they are
        queued together and decided in shared transactions (no thread each); without, one
        after another."""
        if self.group_commit is None:
            return [_outcome(partial(self.decide, operation)) for operation in operations]
        values = self.group_commit.run_many([operation.request for operation in operations])
        return [
            value
            if isinstance(value, Exception) or operation.finish is None
            else _outcome(partial(operation.finish, value))
            for operation, value in zip(operations, values, strict=True)
        ]

    def release(
        self,
        queue: str,
        resources: Mapping[str, Any],
        *,
        partition: str = DEFAULT_PARTITION,
        user: str | None = None,
        groups: Iterable[str] | None = (),
        application: str | None = None,
        finished: bool = False,
        key: str | None = None,
    ) -> None:
        """Return in-use resources of ``queue``: the resource is gone again.

        Never refused for being over a limit. Releasing more than is in use raises
        :class:`UsageUnderflow` and changes nothing. With ``key`` the release happens once:
        calling again with the same key and request (after a timeout or a failover, when the
        caller cannot tell whether the first call was applied) changes nothing, and the key
        with a different request raises :class:`IdempotencyConflict`.
        """
        validation.partition(partition)
        validation.queue(queue)
        amounts = {res: n for res, n in self._bounded(resources, self.bounds.request).items() if n > 0}
        user = validation.optional_name(user, "user")
        application = validation.optional_name(application, "application")
        validation.names(groups, "groups")
        validation.flag(finished, "finished")
        key = validation.optional_name(key, "key")
        operation_id = str(uuid.uuid4()) if key is None else release.keyed_operation_id(partition, key)
        operation = partial(
            release.release,
            partition=partition,
            queue=queue,
            amounts=amounts,
            user=user,
            application=application,
            finished=finished,
            operation_id=operation_id,
            key=key,
        )
        self.driver.run(operation)

    def release_reservation(self, reservation_id: str, *, finished: bool = False) -> Reservation:
        """Release everything a committed reservation holds (its pod is gone), once.

        Its committed amounts leave the queue, user, group and application counters, and it
        leaves the ResourceQuotas that count it; ``finished`` ends its application's run. A
        pending reservation is rolled back instead; releasing again returns it unchanged.
        """
        validation.reservation_id(reservation_id)
        validation.flag(finished, "finished")
        operation_id = str(uuid.uuid4())
        return self._decide(
            lambda tx: release.release_reservation(tx, self.rules, reservation_id, finished, operation_id)
        )

    def release_pod(
        self, pod: Any, *, partition: str = DEFAULT_PARTITION, key: str | None = None, finished: bool = False
    ) -> Reservation:
        """Release the reservation :meth:`reserve_pod` made for this Pod (found by ``key``,
        default its ``metadata.uid``)."""
        validation.partition(partition)
        request = pods.parse_pod(pod)
        lookup = validation.optional_name(key if key is not None else request.uid, "key")
        if lookup is None:
            raise InvalidRequest("the pod has no metadata.uid: pass key=", field="key")
        return self.release_reservation(self.get_by_key(lookup, partition=partition).id, finished=finished)

    # -- Kubernetes ResourceQuota ----------------------------------------------------------
    def apply_resource_quota(self, manifest: Any, *, partition: str = DEFAULT_PARTITION) -> dict[str, Any]:
        """Create or replace a v1 ResourceQuota (dict or YAML, as Kubernetes serves it).

        Validated as the API server does (:class:`InvalidResourceQuota` names the field). Its
        usage is computed at once from the live reservations it matches in the namespace's
        queue. Returns its status (``hard`` and ``used`` in Kubernetes quantities).
        """
        validation.partition(partition)
        quota = kube_quotas.parse(manifest)
        self.bounds.limit_set(quota.hard, "spec.hard")
        edit = resource_quotas.put(partition, quota.key, kube_quotas.stored_manifest(quota))
        self.driver.run(lambda tx: self._apply(tx, kube_edit=edit))
        return self.resource_quota_status(quota.namespace, quota.name, partition=partition)

    def delete_resource_quota(self, namespace: str, name: str, *, partition: str = DEFAULT_PARTITION) -> None:
        """Delete a ResourceQuota; its counters go with it. Unknown quotas raise
        :class:`ResourceQuotaNotFound`."""
        validation.partition(partition)
        key = f"{validation.namespace(namespace)}/{validation.subdomain(name, 'name')}"
        edit = resource_quotas.remove(partition, key)
        self.driver.run(lambda tx: self._apply(tx, kube_edit=edit))

    def apply_admission_config(self, manifest: Any, *, partition: str = DEFAULT_PARTITION) -> None:
        """Set the ResourceQuota admission plugin's configuration (an AdmissionConfiguration
        or a ResourceQuotaConfiguration with ``limitedResources``); ``None`` removes it."""
        validation.partition(partition)
        parsed = None if manifest is None else kube_admission.parse(manifest)
        edit = resource_quotas.set_admission(partition, None if parsed is None else parsed.manifest)
        self.driver.run(lambda tx: self._apply(tx, kube_edit=edit))

    def resource_quotas(self, *, partition: str = DEFAULT_PARTITION) -> list[tuple[str, str]]:
        """(namespace, name) of every ResourceQuota in the partition."""
        validation.partition(partition)
        return self.driver.run(lambda tx: reads.quota_names(tx, self.rules, partition), read_only=True)

    def resource_quota_status(
        self, namespace: str, name: str, *, partition: str = DEFAULT_PARTITION
    ) -> dict[str, Any]:
        """``{"hard": {...}, "used": {...}}`` in Kubernetes quantities, from the ledger."""
        validation.partition(partition)
        key = f"{validation.namespace(namespace)}/{validation.subdomain(name, 'name')}"
        return self.driver.run(
            lambda tx: reads.quota_status(tx, self.rules, partition, key), isolation="REPEATABLE READ"
        )

    # -- expiry ------------------------------------------------------------------------------
    def expire(
        self,
        *,
        batch_size: int = 500,
        max_batches: int | None = None,
        workers: int = 1,
        max_rate: float | None = None,
    ) -> int:
        """Expire pending reservations whose time ran out; returns how many.

        Works in batches of ``batch_size``, one short transaction each, skipping rows another
        sweeper or a concurrent commit holds, so several sweepers (``workers`` threads here,
        or other processes) can run at once and an interrupted sweep loses nothing.
        ``max_batches`` bounds the batches of this call in all. ``max_rate`` holds the call to
        that many reservations per second on average (pausing between batches), so that a
        large backlog is worked off without taking the database from live traffic; None
        sweeps as fast as the database allows.
        """
        validation.sweep_options(batch_size, max_batches, workers, max_rate)
        return expire.sweep(
            self.driver,
            self.rules,
            batch_size=batch_size,
            budget=batches.Budget(max_batches),
            workers=workers,
            pacer=batches.Pacer(max_rate),
        )

    # -- reading -----------------------------------------------------------------------------
    def usage(self, queue: str, *, partition: str = DEFAULT_PARTITION) -> dict[str, Usage]:
        """Usage of ``queue``'s whole subtree per resource, with the queue's own limit."""
        validation.partition(partition)
        validation.queue(queue)
        return self.driver.run(lambda tx: reads.usage(tx, partition, queue), read_only=True)

    # -- users, groups and applications -----------------------------------------------------
    def user_usage(self, user: str, *, partition: str = DEFAULT_PARTITION) -> dict[str, Any]:
        """The user's usage tree in YuniKorn's ``UserResourceUsageDAOInfo`` shape."""
        name = validation.name(user, "user")
        report = self._report(
            partition, lambda rules, apps: reports.user_report(rules, name, apps), "user", name
        )
        if report is None:
            raise UserNotFound(name)
        return report

    def group_usage(self, group: str, *, partition: str = DEFAULT_PARTITION) -> dict[str, Any]:
        """The group's usage tree in YuniKorn's ``GroupResourceUsageDAOInfo`` shape."""
        name = validation.name(group, "group")
        report = self._report(
            partition, lambda rules, apps: reports.group_report(rules, name, apps), "group", name
        )
        if report is None:
            raise GroupNotFound(name)
        return report

    def user_usages(self, *, partition: str = DEFAULT_PARTITION) -> list[dict[str, Any]]:
        """Every tracked or configured user's usage tree."""
        return self._report(partition, reads.all_users, None, None)

    def group_usages(self, *, partition: str = DEFAULT_PARTITION) -> list[dict[str, Any]]:
        """Every tracked or configured group's usage tree (``*`` is the shared wildcard bucket)."""
        return self._report(partition, reads.all_groups, None, None)

    def application_summary(self, application: str, *, partition: str = DEFAULT_PARTITION) -> dict[str, Any]:
        """The usage summary of the application's last finished run (also logged on one line
        as ``QUOTA_APP_SUMMARY: {...}``): resource x seconds, with submission, start and finish
        times in epoch milliseconds, user and queue."""
        validation.partition(partition)
        name = validation.name(application, "application")
        found = self.driver.run(lambda tx: tx.latest_summary(partition, name), read_only=True)
        if found is None:
            raise ApplicationNotFound(name)
        return found

    def _report(
        self,
        partition: str,
        build: Callable[[PartitionRules, list[AppState]], T],
        kind: str | None,
        name: str | None,
    ) -> T:
        validation.partition(partition)
        return self.driver.run(
            lambda tx: reads.report(tx, self.rules, partition, build, kind, name),
            isolation="REPEATABLE READ",
            read_only=True,
        )

    # -- audit -------------------------------------------------------------------------------
    def audit(self, *, fix: bool = False, partition: str | None = None) -> list[Drift]:
        """Recompute every counter from the history and report those that disagree.

        The history is the journal of commits and releases (for ``in_use``) and the pending
        reservation items (for ``reserved``). With ``fix=True`` each partition is repaired
        under its exclusive lock and the drifts come back with ``fixed=True``.
        """
        validation.flag(fix, "fix")
        wanted = validation.optional_partition(partition)
        names = [wanted] if wanted is not None else self.driver.partitions()
        return audit.audit(self.driver, self.rules, names, fix)

    # -- internals ---------------------------------------------------------------------------
    def _reservation(self, request: ReserveRequest) -> Operation[Reservation]:
        step = partial(reserve.general, rules=self.rules, bounds=self.bounds, request=request)
        fast = partial(reserve.by_function_in, rules=self.rules, request=request) if self._functions else None
        alone = partial(reserve.reserve, self.driver, self.rules, self.bounds, request)
        return Operation(group_commit.Request(step, (request.partition, request.queue), fast, alone))

    @property
    def _functions(self) -> bool:
        """Whether a batch may decide requests by function calls (PostgreSQL, with batching)."""
        return self.group_commit is not None and self.group_commit.functions

    def _commit_alone(
        self, reservation_id: str, amounts: dict[str, int] | None, operation_id: str
    ) -> tuple[Reservation, bool]:
        return resolve.commit(self.driver, self.rules, reservation_id, amounts, operation_id), False

    def _decide(self, step: Callable[[LedgerTx], T]) -> T:
        """Run ``step`` in a transaction of its own, or in the next batch with batching."""
        return self.decide(Operation(group_commit.Request(step)))

    @staticmethod
    def _bounded(resources: object, bound: Callable[[Mapping[str, Any]], None]) -> dict[str, int]:
        """Parse a resource mapping once its size is within ``bound`` (counted before parsing)."""
        if not isinstance(resources, Mapping):
            raise InvalidRequest("resources must map resource names to quantities", field="resources")
        bound(resources)
        return parse_resources(resources)

    def _apply(self, tx: LedgerTx, edit: configure.Edit | None = None, **kw: Any) -> int:
        return configure.apply(tx, edit, compiled=self.rules.remember, bounds=self.bounds, **kw)
