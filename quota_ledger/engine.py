"""QuotaEngine: the one object service code holds. It decides; the driver reads and writes."""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy.engine import URL

from quota_ledger import auditing, charging, configuring, identity, namespaces, queues, reports, tracking
from quota_ledger import limits as limit_rules
from quota_ledger.config.rules import APPLICATIONS, GROUP, USER, PartitionRules, Rules
from quota_ledger.driver.core import DbQuotaDriver
from quota_ledger.driver.statements import LedgerTx, MissingCounters, StoredReservation
from quota_ledger.errors import (
    ApplicationNotFound,
    GroupNotFound,
    IdempotencyConflict,
    InvalidCommit,
    InvalidRequest,
    OverQuota,
    ReservationNotFound,
    ReservationStateError,
    UsageUnderflow,
    UserNotFound,
)
from quota_ledger.limits import QUEUE, SUBTREE, Counter
from quota_ledger.quantity import parse_limits, parse_resources
from quota_ledger.tracking import AppState
from quota_ledger.values import ConfigProblem, Drift, Reservation, ReservationState, Usage

log = logging.getLogger("quota_ledger")
summary_log = logging.getLogger("quota_ledger.summary")

T = TypeVar("T")
DEFAULT_PARTITION = "default"
DEFAULT_TTL = 300.0
MAX_TTL = 7 * 24 * 3600.0


class QuotaEngine:
    """Reserve resources against queue limits, then commit or roll back.

    Every method is one database transaction (retried as a whole on transient failures) and
    is all-or-nothing: it either applies completely or raises and changes nothing.
    """

    def __init__(self, driver: DbQuotaDriver, *, default_ttl: float = DEFAULT_TTL) -> None:
        self.driver = driver
        self.default_ttl = _ttl_seconds(default_ttl)
        self._compiled: Rules | None = None
        driver.identity_creator = self._create_identity_counters

    @classmethod
    def from_url(
        cls, url: str | URL, *, default_ttl: float = DEFAULT_TTL, pool_size: int = 10, echo: bool = False
    ) -> QuotaEngine:
        """An engine on ``postgresql+psycopg://``, ``mysql+pymysql://`` or ``sqlite:///`` URLs."""
        return cls(DbQuotaDriver.from_url(url, pool_size=pool_size, echo=echo), default_ttl=default_ttl)

    def migrate(self, revision: str = "head") -> None:
        """Upgrade the schema with Alembic (to ``head`` by default). Safe to call repeatedly."""
        from quota_ledger import migrate

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
        queues.validate_partition(partition)
        queues.validate_queue(queue)
        wanted = parse_limits(resources)
        if APPLICATIONS in wanted:
            raise InvalidRequest("set maxapplications in the configuration", field=APPLICATIONS)
        edit = configuring.set_queue_max(partition, queue, wanted)
        return self.driver.run(lambda tx: configuring.apply(tx, edit))

    # -- configuration -----------------------------------------------------------------------
    def apply_config(self, source: Any) -> int:
        """Apply a YuniKorn queue configuration (YAML text, a dict or a path) to every partition.

        All or nothing, in one transaction: on any problem raises :class:`ConfigError` listing
        all of them and changes nothing. Reservations keep flowing and see either the old or
        the new limits. Returns the new version.
        """
        source = _read_path(source)
        return self.driver.run(lambda tx: configuring.apply(tx, configuring.replace_with(source)))

    def validate_config(self, source: Any) -> list[ConfigProblem]:
        """Every problem of a configuration; changes nothing (empty list: it would apply)."""
        return configuring.check(_read_path(source))[1]

    def apply_namespace(self, manifest: Any, *, partition: str = DEFAULT_PARTITION) -> str:
        """Place a Kubernetes Namespace (dict or YAML, as Kubernetes serves it) on its queue.

        ``root.<name>``, or under the queue named by ``yunikorn.apache.org/parentqueue``; the
        queue's max comes from ``yunikorn.apache.org/namespace.quota`` (or the deprecated
        ``namespace.max.cpu``/``.max.memory``) and is applied as a new configuration version.
        Returns the queue path.
        """
        queues.validate_partition(partition)
        found = namespaces.placement(manifest)
        edit = configuring.set_namespace_max(partition, found.queue, found.max)

        def work(tx: LedgerTx) -> str:
            configuring.apply(tx, edit)
            tx.place_namespace(partition, found.namespace, found.queue, tx.db_now())
            return found.queue

        return self.driver.run(work)

    def namespace_queue(self, namespace: str, *, partition: str = DEFAULT_PARTITION) -> str:
        """The queue a namespace's reservations go to (``root.<namespace>`` if never placed)."""
        queues.validate_partition(partition)
        name = _optional_name(namespace, "namespace")
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
        queues.validate_partition(partition)
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
    ) -> Reservation:
        """Reserve ``resources`` in ``queue`` if every limit on the way to root allows it.

        Raises :class:`OverQuota` listing every limit that would be broken. With ``key``, a
        repeated call returns the original reservation (in whatever state it is now).
        """
        queues.validate_partition(partition)
        queues.validate_queue(queue)
        amounts = parse_resources(resources)
        group_list = tuple(_name_list(groups, "groups"))
        identity = {
            "user": _optional_name(user, "user"),
            "application": _optional_name(application, "application"),
            "priority_class": _optional_name(priority_class, "priority_class"),
        }
        key = _optional_name(key, "key")
        ttl_seconds = self.default_ttl if ttl is None else _ttl_seconds(ttl)
        positive = {res: amount for res, amount in amounts.items() if amount > 0}
        request_hash = _request_hash(partition, queue, positive, group_list, identity)
        reservation_id = str(uuid.uuid4())
        chain = queues.lineage(queue)

        def work(tx: LedgerTx) -> Reservation:
            if key is not None and (found := tx.find_reservation_by_key(partition, key)):
                return _same_request(found, partition, key, request_hash)
            if tx.attempt and (found := tx.find_reservation(reservation_id)):
                return found.reservation  # the first attempt committed before the connection dropped
            now = tx.lock_partition(partition, exclusive=False)
            reservation = Reservation(
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
            # Write our own new rows first and lock the shared counters last, so they are held
            # only for check, update and commit. A refusal rolls the inserts back.
            tx.insert_reservation(reservation, request_hash)
            if not positive:
                tx.ensure_partition(partition, now)  # no counters will name it; the sweeper must
            app: AppState | None = None
            rules: PartitionRules | None = None
            if charging.tracked(identity["user"], identity["application"]):
                rules = self._rules(tx).partition(partition)
                app = charging.open_app(
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
                charging.save(tx, app)
            # A new application counts against every maxapplications on its way to root.
            requested = {**positive, APPLICATIONS: 1} if app is not None and app.started_now else positive
            pairs = [(queue, r) for r in positive]
            own = tx.lock_queue_counters(partition, pairs, create_missing=False)
            if len(own) < len(pairs):
                # First use of these counters: refuse before creating them if the limits already
                # say no, so that a refused request leaves no trace.
                unlocked = tx.lock_subtree_counters(partition, chain, requested, lock=False)
                if broken := limit_rules.violations(partition, requested, unlocked):
                    raise OverQuota(broken)
                raise MissingCounters(partition, sorted(set(pairs) - own.keys()))
            limits = tx.lock_subtree_counters(partition, chain, requested)
            scoped = []
            if app is not None and rules is not None:
                scoped = charging.lock_for_reserve(tx, rules, app, requested)
            broken = limit_rules.violations(partition, requested, [*limits, *scoped])
            if broken:
                raise OverQuota(broken)
            limit_rules.check_overflow(positive, [*own.values(), *limits, *scoped])
            shared = [*own.values(), *limits]
            tx.apply_counter_deltas({c.id: _reserve_delta(c, requested) for c in shared}, now)
            tx.apply_identity_deltas({c.id: _reserve_delta(c, requested) for c in scoped}, now)
            return reservation

        return self.driver.run(work)

    def get(self, reservation_id: str) -> Reservation:
        """The reservation with this id, as stored now."""
        found = self.driver.run(lambda tx: tx.find_reservation(str(reservation_id)))
        if found is None:
            raise ReservationNotFound(str(reservation_id))
        return found.reservation

    def commit(self, reservation_id: str, resources: Mapping[str, Any] | None = None) -> Reservation:
        """Turn a pending reservation into in-use usage.

        ``resources`` may name less than was reserved (missing resources commit nothing); the
        rest is released in the same transaction. Committing a committed reservation returns
        it; a rolled-back or expired one raises :class:`ReservationStateError`, also when its
        expiry time has passed but no sweep has run yet (it is expired on the spot).
        """
        partial = None if resources is None else parse_resources(resources)
        operation_id = str(uuid.uuid4())

        def work(tx: LedgerTx) -> tuple[Reservation, bool]:
            stored, now = self._lock(tx, reservation_id)
            current = stored.reservation
            if current.state is ReservationState.COMMITTED:
                return current, False
            if current.state is not ReservationState.PENDING:
                raise ReservationStateError(current.id, current.state, "commit")
            if now.replace(tzinfo=UTC) >= current.expires_at:
                return self._resolve(tx, current, ReservationState.EXPIRED, {}, now, ""), True
            committed = _commit_amounts(current, partial)
            return self._resolve(tx, current, ReservationState.COMMITTED, committed, now, operation_id), False

        result, expired = self.driver.run(work)
        if expired:
            raise ReservationStateError(result.id, result.state, "commit")
        return result

    def rollback(self, reservation_id: str) -> Reservation:
        """Release a pending reservation. Rolling back twice, or an expired one, returns it;
        rolling back a committed one raises :class:`ReservationStateError`."""

        def work(tx: LedgerTx) -> Reservation:
            stored, now = self._lock(tx, reservation_id)
            current = stored.reservation
            if current.state is ReservationState.COMMITTED:
                raise ReservationStateError(current.id, current.state, "roll back")
            if current.state is not ReservationState.PENDING:
                return current
            return self._resolve(tx, current, ReservationState.ROLLED_BACK, {}, now, "")

        return self.driver.run(work)

    def release(
        self,
        queue: str,
        resources: Mapping[str, Any],
        *,
        partition: str = DEFAULT_PARTITION,
        user: str | None = None,
        groups: Iterable[str] = (),
        application: str | None = None,
        finished: bool = False,
    ) -> None:
        """Return in-use resources of ``queue``: the resource is gone again.

        Never refused for being over a limit. Releasing more than is in use raises
        :class:`UsageUnderflow` and changes nothing.
        """
        queues.validate_partition(partition)
        queues.validate_queue(queue)
        amounts = {res: amount for res, amount in parse_resources(resources).items() if amount > 0}
        _optional_name(user, "user")
        _optional_name(application, "application")
        _name_list(groups, "groups")
        operation_id = str(uuid.uuid4())
        user = _optional_name(user, "user")
        application = _optional_name(application, "application")

        def work(tx: LedgerTx) -> None:
            if tx.attempt and tx.operation_recorded(operation_id):
                return  # the first attempt committed before the connection dropped
            now = tx.db_now()
            app = None
            stopped = False
            if charging.tracked(user, application):
                key = tracking.app_key(application, user, queue)
                app = tx.lock_apps(partition, [key]).get(key)
                if app is not None:
                    charging.check_owner(app, user, queue)
                if short := tracking.shortfalls(app, amounts):
                    raise UsageUnderflow(partition, queue, short)
                if app is not None:
                    tracking.release(app, amounts, now)
                    if finished:
                        stopped = _stop(tx, app, now, "Completed")
                    tx.update_app(app)
            own = tx.lock_queue_counters(partition, [(queue, r) for r in amounts], create_missing=False)
            short = {
                res: (own[(queue, res)].in_use if (queue, res) in own else 0, amount)
                for res, amount in amounts.items()
                if (queue, res) not in own or own[(queue, res)].in_use < amount
            }
            if short:
                raise UsageUnderflow(partition, queue, short)
            resources = [*amounts, *([APPLICATIONS] if stopped else [])]
            limits = tx.lock_subtree_counters(partition, queues.lineage(queue), resources)
            scoped = charging.charges(app, charging.lock_of(tx, [app], resources)) if app is not None else []

            def delta(c: Counter) -> tuple[int, int]:
                return (-1, 0) if c.resource == APPLICATIONS else (-amounts[c.resource], 0)

            tx.apply_counter_deltas({c.id: delta(c) for c in [*own.values(), *limits]}, now)
            tx.apply_identity_deltas({c.id: delta(c) for c in scoped}, now)
            tx.append_journal(
                partition,
                queue,
                {res: -amount for res, amount in amounts.items()},
                kind="release",
                operation_id=operation_id,
                reservation_id=None,
                now=now,
            )

        self.driver.run(work)

    # -- expiry ------------------------------------------------------------------------------
    def expire(self, *, batch_size: int = 500, max_batches: int | None = None) -> int:
        """Expire pending reservations whose time ran out; returns how many.

        Works in batches of ``batch_size``, one short transaction each, skipping rows another
        sweeper or a concurrent commit holds, so several sweepers can run at once and an
        interrupted sweep loses nothing.
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise InvalidRequest("batch_size must be a positive integer", field="batch_size")
        total = 0
        batches = 0
        for partition in self.driver.partitions():
            while max_batches is None or batches < max_batches:
                done = self.driver.run(
                    partial(self._expire_batch, partition=partition, batch_size=batch_size)
                )
                batches += 1
                total += done
                if done < batch_size:
                    break
        return total

    def _expire_batch(self, tx: LedgerTx, partition: str, batch_size: int) -> int:
        now = tx.db_now()
        stored = tx.lock_expired(partition, batch_size, now)
        if not stored:
            return 0
        expiring = [s.reservation for s in stored]
        keys = {charging.key_of(r) for r in expiring if charging.tracked(r.user, r.application)}
        apps = tx.lock_apps(partition, keys)
        for reservation in expiring:
            if (app := apps.get(charging.key_of(reservation))) is not None:
                tracking.resolve(app, reservation.resources, {}, now)
        stopping = [a for a in apps.values() if tracking.idle(a) and _stop(tx, a, now, "Expired")]
        for app in apps.values():
            tx.update_app(app)
        pairs = {(r.queue, res) for r in expiring for res in r.resources}
        resources = {res for _, res in pairs} | ({APPLICATIONS} if stopping else set())
        own = tx.lock_queue_counters(partition, pairs, create_missing=False)
        scopes = {scope for r in expiring for scope in queues.lineage(r.queue)}
        limits = _by_key(tx.lock_subtree_counters(partition, scopes, resources))
        scoped = charging.lock_of(tx, apps.values(), resources)
        deltas: dict[int, tuple[int, int]] = {}
        identity_deltas: dict[int, tuple[int, int]] = {}
        for reservation in expiring:
            for counter in _counters_of(reservation, own, limits):
                charging.add_delta(deltas, counter, 0, -reservation.resources[counter.resource])
            if (app := apps.get(charging.key_of(reservation))) is not None:
                for named in charging.charges(app, scoped):
                    if (amount := reservation.resources.get(named.resource)) is not None:
                        charging.add_delta(identity_deltas, named, 0, -amount)
        for app in stopping:
            for scope in queues.lineage(app.queue):
                if (count := limits.get((scope, APPLICATIONS))) is not None:
                    charging.add_delta(deltas, count, -1, 0)
            for named in charging.charges(app, scoped):
                if named.resource == APPLICATIONS:
                    charging.add_delta(identity_deltas, named, -1, 0)
        tx.apply_counter_deltas(deltas, now)
        tx.apply_identity_deltas(identity_deltas, now)
        return tx.expire_reservations([r.id for r in expiring], now)

    # -- reading -----------------------------------------------------------------------------
    def usage(self, queue: str, *, partition: str = DEFAULT_PARTITION) -> dict[str, Usage]:
        """Usage of ``queue``'s whole subtree per resource, with the queue's own limit."""
        queues.validate_partition(partition)
        queues.validate_queue(queue)
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
        name = _optional_name(user, "user")
        report = self._report(
            partition, lambda rules, apps: reports.user_report(rules, name, apps), "user", name
        )
        if report is None:
            raise UserNotFound(name)
        return report

    def group_usage(self, group: str, *, partition: str = DEFAULT_PARTITION) -> dict[str, Any]:
        """The group's usage tree in YuniKorn's ``GroupResourceUsageDAOInfo`` shape."""
        name = _optional_name(group, "group")
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
        queues.validate_partition(partition)
        name = _optional_name(application, "application")
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
        queues.validate_partition(partition)

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
        names = [queues.validate_partition(partition)] if partition else self.driver.partitions()
        drifts: list[Drift] = []
        for name in names:
            if fix:
                drifts += self.driver.run(partial(auditing.fix_partition, partition=name))
            else:
                drifts += self.driver.run(
                    partial(auditing.read_drift, partition=name), isolation="REPEATABLE READ"
                )
        return drifts

    # -- internals ---------------------------------------------------------------------------
    @staticmethod
    def _lock(tx: LedgerTx, reservation_id: str) -> tuple[StoredReservation, datetime]:
        if not isinstance(reservation_id, str):
            raise InvalidRequest("reservation id must be a string", field="id")
        found = tx.lock_reservation(reservation_id)
        if found is None:
            raise ReservationNotFound(reservation_id)
        return found

    @staticmethod
    def _resolve(
        tx: LedgerTx,
        reservation: Reservation,
        state: ReservationState,
        committed: Mapping[str, int],
        now: datetime,
        operation_id: str,
    ) -> Reservation:
        """Move a locked pending reservation to ``state`` and adjust its counters.

        The reservation's own rows (already locked) and the journal (new rows) are written
        first; the shared counters are locked last, so they are held for the shortest time.
        An application whose last reservation goes away with nothing in use stops running.
        """
        if not tx.resolve_reservation(reservation.id, state, now):
            raise ReservationStateError(reservation.id, reservation.state, state.value)
        if state is ReservationState.COMMITTED:
            tx.record_commits(reservation.id, committed, whole=committed == reservation.resources)
            tx.append_journal(
                reservation.partition,
                reservation.queue,
                committed,
                kind="commit",
                operation_id=operation_id,
                reservation_id=reservation.id,
                now=now,
            )
        app = None
        stopped = False
        if charging.tracked(reservation.user, reservation.application):
            app = tx.lock_apps(reservation.partition, [charging.key_of(reservation)]).get(
                charging.key_of(reservation)
            )
        if app is not None:
            tracking.resolve(app, reservation.resources, committed, now)
            if state is not ReservationState.COMMITTED and tracking.idle(app):
                how = "Expired" if state is ReservationState.EXPIRED else "RolledBack"
                stopped = _stop(tx, app, now, how)
            tx.update_app(app)
        resources = [*reservation.resources, *([APPLICATIONS] if stopped else [])]
        pairs = [(reservation.queue, res) for res in reservation.resources]
        own = tx.lock_queue_counters(reservation.partition, pairs, create_missing=False)
        limits = tx.lock_subtree_counters(reservation.partition, queues.lineage(reservation.queue), resources)
        counters = _counters_of(reservation, own, _by_key(limits), stopped=stopped)
        scoped = charging.charges(app, charging.lock_of(tx, [app], resources)) if app is not None else []
        limit_rules.check_overflow(committed, [*counters, *scoped], field="in_use")

        def delta(c: Counter) -> tuple[int, int]:
            if c.resource == APPLICATIONS:
                return -1, 0
            return committed.get(c.resource, 0), -reservation.resources[c.resource]

        tx.apply_counter_deltas({c.id: delta(c) for c in counters}, now)
        tx.apply_identity_deltas({c.id: delta(c) for c in scoped}, now)
        return replace(
            reservation,
            state=state,
            committed=dict(committed) if state is ReservationState.COMMITTED else None,
            resolved_at=now.replace(tzinfo=UTC),
        )

    # -- user/group counters -------------------------------------------------------------------
    def _rules(self, tx: LedgerTx) -> Rules:
        """The compiled configuration in force, read under the caller's partition lock."""
        version = tx.config_version()
        compiled = self._compiled
        if compiled is None or compiled.version != version:
            compiled = configuring.compile_stored(version, *tx.load_config(version))
            self._compiled = compiled
        return compiled

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


def _stop(tx: LedgerTx, app: AppState, now: datetime, how: str) -> bool:
    """Finish a running application; True when it counted as running (a named one)."""
    summary = tracking.finish(app, now, how)
    if summary is None:
        return False
    tx.insert_summary(app.partition, summary, now)
    line = json.dumps(summary, sort_keys=True, separators=(",", ":"))
    tx.after_commit.append(lambda: summary_log.info("QUOTA_APP_SUMMARY: %s", line))
    return True


def _reserve_delta(counter: Counter, requested: Mapping[str, int]) -> tuple[int, int]:
    """A running-application count is in use at once; resources are reserved."""
    if counter.resource == APPLICATIONS:
        return requested[APPLICATIONS], 0
    return 0, requested[counter.resource]


def _by_key(counters: Iterable[Counter]) -> dict[tuple[str, str], Counter]:
    return {(c.scope, c.resource): c for c in counters}


def _counters_of(
    reservation: Reservation,
    own: Mapping[tuple[str, str], Counter],
    limits: Mapping[tuple[str, str], Counter],
    *,
    stopped: bool = False,
) -> list[Counter]:
    """The locked counters a reservation is charged to: its queue's and its lineage's limits,
    and the lineage's application counts when its application stops running."""
    chain = queues.lineage(reservation.queue)
    found = []
    for resource in reservation.resources:
        if (mine := own.get((reservation.queue, resource))) is not None:
            found.append(mine)
        found += [c for scope in chain if (c := limits.get((scope, resource))) is not None]
    if stopped:
        found += [c for scope in chain if (c := limits.get((scope, APPLICATIONS))) is not None]
    return found


def _commit_amounts(reservation: Reservation, partial: Mapping[str, int] | None) -> dict[str, int]:
    if partial is None:
        return dict(reservation.resources)
    extra = sorted(set(partial) - set(reservation.resources))
    if any(partial[res] > 0 for res in extra):
        raise InvalidCommit(f"resources not reserved: {', '.join(extra)}", field=extra[0])
    too_much = [res for res in reservation.resources if partial.get(res, 0) > reservation.resources[res]]
    if too_much:
        detail = ", ".join(
            f"{res}: reserved {reservation.resources[res]}, commit {partial[res]}" for res in too_much
        )
        raise InvalidCommit(f"cannot commit more than was reserved: {detail}", field=too_much[0])
    return {res: partial.get(res, 0) for res in reservation.resources}


def _same_request(found: StoredReservation, partition: str, key: str, request_hash: str) -> Reservation:
    if found.request_hash != request_hash:
        raise IdempotencyConflict(partition, key, found.reservation.id)
    return found.reservation


def _request_hash(
    partition: str,
    queue: str,
    amounts: Mapping[str, int],
    groups: tuple[str, ...],
    identity: Mapping[str, Any],
) -> str:
    # ttl is left out on purpose: a retry that recomputes its deadline is the same request.
    canonical = json.dumps(
        {"p": partition, "q": queue, "r": amounts, "g": sorted(groups), **identity},
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def _ttl_seconds(ttl: object) -> float:
    if isinstance(ttl, timedelta):
        seconds = ttl.total_seconds()
    elif isinstance(ttl, (int, float)) and not isinstance(ttl, bool):
        seconds = float(ttl)
    else:
        raise InvalidRequest(f"ttl must be seconds or a timedelta, not {ttl!r}", field="ttl")
    if not 0 < seconds <= MAX_TTL:
        raise InvalidRequest(f"ttl must be > 0 and at most {MAX_TTL:.0f} seconds, not {seconds}", field="ttl")
    return seconds


def _optional_name(value: object, field: str) -> Any:
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > 255 or not value.isprintable():
        raise InvalidRequest(f"{field} must be a printable string of 1-255 characters", field=field)
    return value


def _name_list(values: Iterable[str], field: str) -> list[str]:
    if isinstance(values, str):
        raise InvalidRequest(f"{field} must be a list of names, not a string", field=field)
    return [_optional_name(v, field) for v in values]


def _read_path(source: Any) -> Any:
    """A path names a file to read; text, bytes and dicts are configurations themselves."""
    if isinstance(source, Path):
        try:
            return source.read_text()
        except OSError as error:
            raise InvalidRequest(f"cannot read {source}: {error.strerror}", field="config") from error
    return source
