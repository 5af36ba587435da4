"""QuotaEngine: the one object service code holds. It decides; the driver reads and writes."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, TypeVar

from sqlalchemy.engine import URL

from quota_ledger.config import identity, reports
from quota_ledger.config.diff import ConfigDiff
from quota_ledger.config.rules import GROUP, USER, PartitionRules, Rules
from quota_ledger.driver.core import DbQuotaDriver
from quota_ledger.driver.counters import MissingCounters
from quota_ledger.driver.tx import LedgerTx
from quota_ledger.kube import admission as kube_admission
from quota_ledger.kube import namespaces, pods
from quota_ledger.kube import quotas as kube_quotas
from quota_ledger.ledger import applications, audit, batches, configure, functions, resolve, resource_quotas
from quota_ledger.model import arguments, queues, tracking, validation
from quota_ledger.model import limits as limit_rules
from quota_ledger.model.errors import (
    ApplicationNotFound,
    GroupNotFound,
    InvalidRequest,
    OverQuota,
    ReservationNotFound,
    ReservationStateError,
    ResourceQuotaNotFound,
    UserNotFound,
)
from quota_ledger.model.limits import QUEUE, SUBTREE
from quota_ledger.model.quantity import APPLICATIONS, parse_limits, parse_resources
from quota_ledger.model.tracking import AppState
from quota_ledger.model.values import (
    ConfigProblem,
    Drift,
    Reservation,
    ReservationState,
    StoredReservation,
    Usage,
)

T = TypeVar("T")
DEFAULT_PARTITION = "default"
DEFAULT_TTL = 300.0


class QuotaEngine:
    """Reserve resources against queue limits, then commit or roll back.

    Every method is one database transaction (retried as a whole on transient failures) and
    is all-or-nothing: it either applies completely or raises and changes nothing.
    """

    def __init__(
        self,
        driver: DbQuotaDriver,
        *,
        default_ttl: float = DEFAULT_TTL,
        max_resources_per_request: int = validation.DEFAULT_MAX_RESOURCES_PER_REQUEST,
        max_resources_per_limit_set: int = validation.DEFAULT_MAX_RESOURCES_PER_LIMIT_SET,
        max_resources_per_partition: int = validation.DEFAULT_MAX_RESOURCES_PER_PARTITION,
    ) -> None:
        self.driver = driver
        self.default_ttl = validation.ttl(default_ttl)
        #: how many resources a request, a limit set and a partition may name
        self.bounds = validation.Bounds(
            resources_per_request=max_resources_per_request,
            resources_per_limit_set=max_resources_per_limit_set,
            resources_per_partition=max_resources_per_partition,
        )
        self._compiled: Rules | None = None
        driver.identity_creator = self._create_identity_counters

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
        )

    def migrate(self, revision: str = "head") -> None:
        """Upgrade the schema with Alembic (to ``head`` by default). Safe to call repeatedly."""
        from quota_ledger.driver import migrate

        with self.driver.translated():
            migrate.upgrade(self.driver.engine, revision)

    def close(self) -> None:
        """Release all database connections."""
        self.driver.dispose()

    def __enter__(self) -> QuotaEngine:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- limits ------------------------------------------------------------------------------
    def set_limits(
        self, queue: str, resources: Mapping[str, Any], *, partition: str = DEFAULT_PARTITION
    ) -> int:
        """Set the named resources' limits on ``queue``'s subtree; None removes a limit.

        Resources not named keep their limits. This edits the stored configuration (the
        queue's ``resources.max``) and applies it through the same validation as
        :meth:`apply_config`; root's limits are the partition's capacity, kept next to it.
        Lowering a limit below current usage is allowed: nothing is evicted, new reservations
        are refused until usage drops. Returns the new configuration version.
        """
        validation.partition(partition)
        validation.queue(queue)
        if isinstance(resources, Mapping):
            self.bounds.limit_set(resources)
        wanted = parse_limits(resources)
        if APPLICATIONS in wanted:
            raise InvalidRequest("set maxapplications in the configuration", field=APPLICATIONS)
        edit = configure.set_queue_max(partition, queue, wanted)
        return self.driver.run(lambda tx: self._apply(tx, edit))

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
        rows = self.driver.run(lambda tx: tx.all_limits(partition))
        result: dict[str, dict[str, int]] = {}
        for counter in rows:
            assert counter.limit is not None
            result.setdefault(counter.scope, {})[counter.resource] = counter.limit
        return result

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
        return self._reserve(
            queue,
            positive,
            partition=partition,
            user=user,
            groups=groups,
            application=application,
            ttl=ttl,
            key=key,
            kube={"usage": usage, "scopes": scopes.as_dict()},
            namespace=queue.rsplit(".", 1)[-1],
        )

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
        validation.partition(partition)
        request = pods.parse_pod(pod)
        self.bounds.request(request.resources, "spec.containers")
        queue = self.namespace_queue(request.namespace, partition=partition)
        return self._reserve(
            queue,
            request.resources,
            partition=partition,
            user=request.user,
            groups=request.groups,
            application=request.application,
            ttl=ttl,
            key=key if key is not None else request.uid,
            kube={"usage": request.usage, "scopes": request.scopes.as_dict()},
            namespace=request.namespace,
            missing={"requests": request.missing_requests, "limits": request.missing_limits},
        )

    def _reserve(
        self,
        queue: str,
        positive: dict[str, int],
        *,
        partition: str,
        user: str | None,
        groups: Iterable[str] | None,
        application: str | None,
        ttl: float | timedelta | None,
        key: str | None,
        kube: dict[str, Any],
        namespace: str,
        missing: Mapping[str, Mapping[str, list[str]]] | None = None,
    ) -> Reservation:
        group_list = validation.names(groups, "groups")
        identity = {
            "user": validation.optional_name(user, "user"),
            "application": validation.optional_name(application, "application"),
            "priority_class": kube["scopes"]["priorityClass"],
        }
        key = validation.optional_name(key, "key")
        ttl_seconds = self.default_ttl if ttl is None else validation.ttl(ttl)
        scopes = {k: v for k, v in kube["scopes"].items() if k != "priorityClass" and v}
        request_hash = arguments.request_hash(partition, queue, positive, group_list, {**identity, **scopes})
        reservation_id = str(uuid.uuid4())
        chain = queues.lineage(queue)
        quota_usage: dict[str, int] = kube["usage"]

        def pending(now: datetime) -> Reservation:
            return Reservation(
                id=reservation_id,
                state=ReservationState.PENDING,
                partition=partition,
                queue=queue,
                resources=positive,
                created_at=now.replace(tzinfo=UTC),
                expires_at=(now + timedelta(seconds=ttl_seconds)).replace(tzinfo=UTC),
                key=key,
                user=identity["user"],
                groups=group_list,
                application=identity["application"],
                priority_class=identity["priority_class"],
            )

        if self.driver.functions and positive:
            rules_now = self._known_rules()
            charges = functions.quota_charges(rules_now, partition, queue, namespace, kube, missing)
            who = functions.identity_of(
                rules_now,
                partition,
                queue,
                positive,
                user=identity["user"],
                groups=group_list,
                application=identity["application"],
            )
            if charges is not None:
                created = functions.reserve(
                    self.driver,
                    rules_now,
                    reservation_id,
                    partition=partition,
                    queue=queue,
                    resources=positive,
                    key=key,
                    request_hash=request_hash,
                    ttl_seconds=ttl_seconds,
                    priority_class=identity["priority_class"],
                    kube=kube,
                    charges=charges,
                    identity=who,
                )
                if created is not None:
                    return pending(created)
                # Declined: nothing was written, unless a lost connection hid our own commit;
                # then the insert below meets our id and the retry finds the reservation.

        def work(tx: LedgerTx) -> Reservation:
            if key is not None and (found := tx.find_reservation_by_key(partition, key)):
                return arguments.same_request(found, partition, key, request_hash)
            if tx.attempt and (found := tx.find_reservation(reservation_id)):
                return found.reservation  # the first attempt committed before the connection dropped
            now = tx.lock_partition(partition, exclusive=False)
            rules = self._rules(tx).partition(partition)
            quotas = resource_quotas.admit(rules, queue, namespace, kube, missing)
            reservation = pending(now)
            # Write our own new rows first and lock the shared counters last, so they are held
            # only for check, update and commit. A refusal rolls the inserts back.
            tx.insert_reservation(reservation, request_hash, kube)
            if not positive:
                tx.ensure_partition(partition, now)  # no counters will name it; the sweeper must
            app: AppState | None = None
            if applications.tracked(identity["user"], identity["application"]):
                app = applications.open_app(
                    tx,
                    rules,
                    partition=partition,
                    queue=queue,
                    user=identity["user"],
                    groups=group_list,
                    application=identity["application"],
                    now=now,
                )
                tracking.add_reserved(app, positive)
                applications.save(tx, app)
            # A new application counts against every maxapplications on its way to root.
            requested = {**positive, APPLICATIONS: 1} if app is not None and app.started_now else positive
            pairs = [(queue, r) for r in positive]
            own = tx.lock_queue_counters(partition, pairs, create_missing=False)
            if len(own) < len(pairs):
                # First use of these counters: refuse before creating them if the queue limits
                # already say no, so that a refused request leaves no trace. With user, group or
                # quota limits in play the counters are created first, so that the refusal can
                # list every broken limit.
                if app is None and not quotas:
                    unlocked = tx.lock_subtree_counters(partition, chain, requested, lock=False)
                    if broken := limit_rules.violations(partition, requested, unlocked):
                        raise OverQuota(broken)
                self.bounds.partition(tx.resource_names(partition) | set(positive), partition)
                raise MissingCounters(partition, sorted(set(pairs) - own.keys()))
            limits = tx.lock_subtree_counters(partition, chain, requested)
            scoped = applications.lock_for_reserve(tx, rules, app, requested) if app is not None else []
            charged = resource_quotas.lock(tx, partition, queue, quotas, quota_usage)
            broken = limit_rules.violations(partition, requested, [*limits, *scoped])
            broken += resource_quotas.violations(partition, quota_usage, charged)
            if broken:
                raise OverQuota(broken)
            limit_rules.check_overflow(positive, [*own.values(), *limits, *scoped])
            limit_rules.check_overflow(quota_usage, charged, field="in_use")
            shared = [*own.values(), *limits]
            tx.apply_counter_deltas({c.id: resolve.reserve_delta(c, requested) for c in shared}, now)
            tx.apply_identity_deltas({c.id: resolve.reserve_delta(c, requested) for c in scoped}, now)
            resource_quotas.charge(tx, charged, quota_usage, +1, now)
            return reservation

        return self.driver.run(work)

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
        validation.reservation_id(reservation_id)
        partial = None if resources is None else self._bounded(resources, self.bounds.request)
        operation_id = str(uuid.uuid4())
        if partial is None and self.driver.functions:
            done = functions.commit(self.driver, reservation_id, operation_id)
            if done is not None:
                return done

        def work(tx: LedgerTx) -> tuple[Reservation, bool]:
            stored, now = self._lock(tx, reservation_id)
            current = stored.reservation
            if current.state is ReservationState.COMMITTED:
                return current, False
            if current.state is not ReservationState.PENDING:
                raise ReservationStateError(current.id, current.state, "commit")
            if now.replace(tzinfo=UTC) >= current.expires_at:
                rules = self._rules(tx).partition(current.partition)
                return resolve.resolve(tx, stored, ReservationState.EXPIRED, {}, now, "", rules), True
            committed = arguments.commit_amounts(current, partial)
            done = resolve.resolve(tx, stored, ReservationState.COMMITTED, committed, now, operation_id)
            return done, False

        result, expired = self.driver.run(work)
        if expired:
            raise ReservationStateError(result.id, result.state, "commit")
        return result

    def rollback(self, reservation_id: str) -> Reservation:
        """Release a pending reservation. Rolling back twice, or an expired one, returns it;
        rolling back a committed one raises :class:`ReservationStateError`."""
        validation.reservation_id(reservation_id)

        def work(tx: LedgerTx) -> Reservation:
            stored, now = self._lock(tx, reservation_id)
            current = stored.reservation
            if current.state is ReservationState.COMMITTED:
                raise ReservationStateError(current.id, current.state, "roll back")
            if current.state is not ReservationState.PENDING:
                return current
            rules = self._rules(tx).partition(current.partition)
            return resolve.resolve(tx, stored, ReservationState.ROLLED_BACK, {}, now, "", rules)

        return self.driver.run(work)

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
    ) -> None:
        """Return in-use resources of ``queue``: the resource is gone again.

        Never refused for being over a limit. Releasing more than is in use raises
        :class:`UsageUnderflow` and changes nothing.
        """
        validation.partition(partition)
        validation.queue(queue)
        amounts = {res: n for res, n in self._bounded(resources, self.bounds.request).items() if n > 0}
        user = validation.optional_name(user, "user")
        application = validation.optional_name(application, "application")
        validation.names(groups, "groups")
        validation.flag(finished, "finished")
        operation_id = str(uuid.uuid4())

        def work(tx: LedgerTx) -> None:
            if tx.attempt and tx.operation_recorded(operation_id):
                return  # the first attempt committed before the connection dropped
            resolve.release_in_use(
                tx, partition, queue, amounts, user, application, finished, operation_id, tx.db_now()
            )

        self.driver.run(work)

    def release_reservation(self, reservation_id: str, *, finished: bool = False) -> Reservation:
        """Release everything a committed reservation holds (its pod is gone), once.

        Its committed amounts leave the queue, user, group and application counters, and it
        leaves the ResourceQuotas that count it; ``finished`` ends its application's run. A
        pending reservation is rolled back instead; releasing again returns it unchanged.
        """
        validation.reservation_id(reservation_id)
        validation.flag(finished, "finished")
        operation_id = str(uuid.uuid4())

        def work(tx: LedgerTx) -> Reservation:
            stored, now = self._lock(tx, reservation_id)
            current = stored.reservation
            rules = self._rules(tx).partition(current.partition)
            if current.state is ReservationState.PENDING:
                return resolve.resolve(tx, stored, ReservationState.ROLLED_BACK, {}, now, "", rules)
            if current.state is not ReservationState.COMMITTED or current.released_at is not None:
                return current
            tx.mark_released(current.id, now)
            amounts = {res: v for res, v in (current.committed or {}).items() if v > 0}
            resolve.release_in_use(
                tx,
                current.partition,
                current.queue,
                amounts,
                current.user,
                current.application,
                finished,
                operation_id,
                now,
                reservation_id=current.id,
            )
            resolve.leave_quotas(tx, rules, [stored], now)
            return replace(current, released_at=now.replace(tzinfo=UTC))

        return self.driver.run(work)

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
        stored = kube_quotas.stored_manifest(quota)

        def edit(kube: dict[str, Any]) -> None:
            entries = kube.setdefault(partition, {}).setdefault("quotas", {})
            entries[quota.key] = {"queue": "", "manifest": stored}

        self.driver.run(lambda tx: self._apply(tx, kube_edit=edit))
        return self.resource_quota_status(quota.namespace, quota.name, partition=partition)

    def delete_resource_quota(self, namespace: str, name: str, *, partition: str = DEFAULT_PARTITION) -> None:
        """Delete a ResourceQuota; its counters go with it. Unknown quotas raise
        :class:`ResourceQuotaNotFound`."""
        validation.partition(partition)
        key = f"{validation.namespace(namespace)}/{validation.subdomain(name, 'name')}"

        def edit(kube: dict[str, Any]) -> None:
            entries = kube.get(partition, {}).get("quotas", {})
            if key not in entries:
                raise ResourceQuotaNotFound(key)
            del entries[key]

        self.driver.run(lambda tx: self._apply(tx, kube_edit=edit))

    def apply_admission_config(self, manifest: Any, *, partition: str = DEFAULT_PARTITION) -> None:
        """Set the ResourceQuota admission plugin's configuration (an AdmissionConfiguration
        or a ResourceQuotaConfiguration with ``limitedResources``); ``None`` removes it."""
        validation.partition(partition)
        parsed = None if manifest is None else kube_admission.parse(manifest)

        def edit(kube: dict[str, Any]) -> None:
            objects = kube.setdefault(partition, {})
            if parsed is None:
                objects.pop("admission", None)
            else:
                objects["admission"] = kube_quotas.json_safe(parsed.manifest)

        self.driver.run(lambda tx: self._apply(tx, kube_edit=edit))

    def resource_quotas(self, *, partition: str = DEFAULT_PARTITION) -> list[tuple[str, str]]:
        """(namespace, name) of every ResourceQuota in the partition."""
        validation.partition(partition)
        rules = self.driver.run(partial(self._partition_rules, partition=partition))
        return sorted((q.namespace, q.name) for qs in rules.quotas.values() for q in qs)

    def resource_quota_status(
        self, namespace: str, name: str, *, partition: str = DEFAULT_PARTITION
    ) -> dict[str, Any]:
        """``{"hard": {...}, "used": {...}}`` in Kubernetes quantities, from the ledger."""
        validation.partition(partition)
        key = f"{validation.namespace(namespace)}/{validation.subdomain(name, 'name')}"

        def work(tx: LedgerTx) -> dict[str, Any]:
            rules = self._rules(tx).partition(partition)
            quota = rules.quota(key)
            if quota is None:
                raise ResourceQuotaNotFound(key)
            counters = tx.identity_counters(partition, lock=False, kinds=[resource_quotas.QUOTA])
            used = {c.resource: c.in_use for c in counters if c.name == key}
            return {
                "hard": {res: kube_quotas.format_value(res, v) for res, v in quota.hard.items()},
                "used": {res: kube_quotas.format_value(res, used.get(res, 0)) for res in quota.hard},
            }

        return self.driver.run(work, isolation="REPEATABLE READ")

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
        budget = batches.Budget(max_batches)
        pacer = batches.Pacer(max_rate)
        total = 0
        for partition in self.driver.partitions():
            # Plain reservations first, a whole batch per server-side call (PostgreSQL) ...
            if self.driver.functions:
                plain_batch = partial(self._expire_plain, partition, batch_size)
                total += batches.run(plain_batch, batch_size, budget, workers, pacer)
            # ... then everything else (and, on the other engines, everything).
            batch = partial(
                self.driver.run,
                partial(
                    resolve.expire_batch,
                    partition=partition,
                    batch_size=batch_size,
                    rules_of=partial(self._partition_rules, partition=partition),
                ),
            )
            total += batches.run(batch, batch_size, budget, workers, pacer)
        return total

    def _expire_plain(self, partition: str, batch_size: int) -> int:
        for _attempt in range(3):
            rules = self._known_rules()
            count = functions.expire_batch(self.driver, rules, partition, batch_size)
            if count is not None:
                return count
            self.driver.run(self._rules)  # the configuration changed: compile the new one
        return 0  # it keeps changing: the general path sweeps what is left

    # -- reading -----------------------------------------------------------------------------
    def usage(self, queue: str, *, partition: str = DEFAULT_PARTITION) -> dict[str, Usage]:
        """Usage of ``queue``'s whole subtree per resource, with the queue's own limit."""
        validation.partition(partition)
        validation.queue(queue)
        rows = self.driver.run(lambda tx: tx.usage_rows(partition, queue))
        limits = {c.resource: c for c in rows if c.scope_type == SUBTREE}
        totals: dict[str, tuple[int, int]] = {}
        for counter in rows:
            if counter.scope_type == QUEUE:
                in_use, reserved = totals.get(counter.resource, (0, 0))
                totals[counter.resource] = (in_use + counter.in_use, reserved + counter.reserved)
        result = {}
        for resource in sorted(limits.keys() | totals.keys()):
            if resource in limits:
                c = limits[resource]
                result[resource] = Usage(in_use=c.in_use, reserved=c.reserved, limit=c.limit)
            else:
                in_use, reserved = totals[resource]
                result[resource] = Usage(in_use=in_use, reserved=reserved, limit=None)
        return result

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

        def build(rules: PartitionRules, apps: list[AppState]) -> list[dict[str, Any]]:
            found = (reports.user_report(rules, u, apps) for u in reports.user_names(rules, apps))
            return [r for r in found if r is not None]

        return self._report(partition, build, None, None)

    def group_usages(self, *, partition: str = DEFAULT_PARTITION) -> list[dict[str, Any]]:
        """Every tracked or configured group's usage tree (``*`` is the shared wildcard bucket)."""

        def build(rules: PartitionRules, apps: list[AppState]) -> list[dict[str, Any]]:
            found = (reports.group_report(rules, g, apps) for g in reports.group_names(rules, apps))
            return [r for r in found if r is not None]

        return self._report(partition, build, None, None)

    def application_summary(self, application: str, *, partition: str = DEFAULT_PARTITION) -> dict[str, Any]:
        """The usage summary of the application's last finished run (also logged on one line
        as ``QUOTA_APP_SUMMARY: {...}``): resource x seconds, with submission, start and finish
        times in epoch milliseconds, user and queue."""
        validation.partition(partition)
        name = validation.name(application, "application")
        found = self.driver.run(lambda tx: tx.latest_summary(partition, name))
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

        def work(tx: LedgerTx) -> T:
            rules = self._rules(tx).partition(partition)
            return build(rules, tx.read_apps(partition, kind, name))

        return self.driver.run(work, isolation="REPEATABLE READ")

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
        drifts: list[Drift] = []
        for name in names:
            if fix:
                rules_of = partial(self._partition_rules, partition=name)
                drifts += self.driver.run(partial(audit.fix_partition, partition=name, rules_of=rules_of))
            else:
                drifts += self.driver.run(
                    partial(
                        audit.read_drift,
                        partition=name,
                        rules_of=partial(self._partition_rules, partition=name),
                    ),
                    isolation="REPEATABLE READ",
                )
        return drifts

    # -- internals ---------------------------------------------------------------------------
    @staticmethod
    def _bounded(resources: object, bound: Callable[[Mapping[str, Any]], None]) -> dict[str, int]:
        """Parse a resource mapping once its size is within ``bound`` (counted before parsing)."""
        if not isinstance(resources, Mapping):
            raise InvalidRequest("resources must map resource names to quantities", field="resources")
        bound(resources)
        return parse_resources(resources)

    @staticmethod
    def _lock(tx: LedgerTx, reservation_id: str) -> tuple[StoredReservation, datetime]:
        found = tx.lock_reservation(reservation_id)
        if found is None:
            raise ReservationNotFound(reservation_id)
        return found

    def _apply(self, tx: LedgerTx, edit: configure.Edit | None = None, **kw: Any) -> int:
        return configure.apply(tx, edit, compiled=self._remember, bounds=self.bounds, **kw)

    def _remember(self, rules: Rules) -> None:
        """Keep the newest compiled configuration (plain reservations are checked against it)."""
        current = self._compiled
        if current is None or rules.version > current.version:
            self._compiled = rules

    # -- user/group counters -------------------------------------------------------------------
    def _rules(self, tx: LedgerTx) -> Rules:
        """The compiled configuration in force, read under the caller's partition lock."""
        version = tx.config_version()
        compiled = self._compiled
        if compiled is None or compiled.version != version:
            compiled = configure.compile_stored(version, *tx.load_config(version))
            self._compiled = compiled
        return compiled

    def _known_rules(self) -> Rules:
        """The newest configuration this engine compiled (compiled once, on first use); the
        PostgreSQL functions check under the partition lock that it is still in force."""
        return self._compiled or self.driver.run(self._rules)

    def _partition_rules(self, tx: LedgerTx, partition: str) -> PartitionRules:
        return self._rules(tx).partition(partition)

    def _create_identity_counters(self, tx: LedgerTx, missing: MissingCounters) -> None:
        """Create a user's wildcard (or any missing) user/group counters from application rows.

        Runs under the shared partition lock with the configuration in force now, so a
        concurrent config change cannot leave a counter with a stale limit behind.
        """
        partition = missing.partition
        now = tx.lock_partition(partition, exclusive=False)
        rules = self._rules(tx).partition(partition)
        names = {(kind, name) for kind, name, _, _ in missing.identity}
        keys = [k for kind, name in sorted(names) for k in tx.app_keys_of(partition, kind, name)]
        apps = list(tx.lock_apps(partition, keys).values())
        rows = {}
        for key in missing.identity:
            kind, name, queue, resource = key
            rule = rules.user_rule(queue, name) if kind == USER else None
            if kind == GROUP and (queue_rule := rules.queues.get(queue)) is not None:
                rule = queue_rule.groups.get(name)
            limit = rule.counters().get(resource) if rule is not None else None
            if limit is not None:
                rows[key] = (*identity.value(apps, key), limit)
        tx.insert_identity_counters(partition, rows, now)
