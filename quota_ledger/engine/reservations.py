"""Reservations: reserve, commit, roll back and release, each also prepared to be decided later."""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Iterable, Mapping
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING, Any

from quota_ledger.config import typos
from quota_ledger.driver.tx import LedgerTx
from quota_ledger.engine import waiting as waits
from quota_ledger.engine.base import DEFAULT_PARTITION, Operation
from quota_ledger.engine.waiting import Waits
from quota_ledger.kube import pods
from quota_ledger.ledger import reads, release, reserve, resolve
from quota_ledger.ledger import waiting as waiting_line
from quota_ledger.model import requests, validation
from quota_ledger.model.errors import InvalidRequest, OverQuota, ReservationNotFound, ReservationStateError
from quota_ledger.model.requests import ReserveRequest
from quota_ledger.model.values import Charged, PodCharge, Reservation, ReservationState, Violation

#: what :func:`recharge_key` appends to a pod's uid (a uid never holds a space)
RECHARGED = " charged"


class Reservations(Waits):
    """The reservation calls of :class:`QuotaEngine`."""

    if TYPE_CHECKING:
        # from KubernetesObjects, which QuotaEngine combines with this class
        def namespace_queue(self, namespace: str, *, partition: str = DEFAULT_PARTITION) -> str: ...

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
        wait: float | timedelta | None = None,
        block: bool = True,
        priority: int = 0,
    ) -> Reservation:
        """Reserve ``resources`` in ``queue`` if every limit on the way to root allows it.

        Raises :class:`OverQuota` listing every limit that would be broken. With ``wait``
        (seconds, or a ``timedelta``) a request that does not fit waits for capacity instead:
        it joins its partition's line, ordered by ``priority`` (higher first), then arrival,
        and is granted as soon as it fits, its ttl counted from the grant (while requests wait
        in the partition, it joins behind them undecided, and a pass grants it in order). The
        call blocks until then and returns the reservation (``pending``), or raises
        :class:`WaitTimeout` (an :class:`OverQuota`) when ``wait`` runs out first, and the
        request leaves the line as ``expired``. With ``block=False`` it returns at once:
        granted, or ``waiting`` with its ``position`` (see :meth:`wait_for`; :meth:`rollback`
        cancels it). A waiting request holds nothing. With ``key``, a
        repeated call returns the original reservation (in whatever state it is now). A
        resource no limit of the partition names, or a queue outside every configured one, is
        named in the reservation's ``warnings``; a partition with ``unknownnames: refuse``
        raises :class:`UnknownResource` or :class:`UnknownQueue` instead.
        ``priority_class``, ``terminating``, ``best_effort`` (default: no vcore/cpu or memory
        requested) and ``cross_namespace_affinity`` are the Kubernetes scope attributes that
        ResourceQuotas in the queue's namespace match on.
        """
        request = self._reserve_request(
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
        seconds, rank = waits.how_to_wait(wait, block, priority)
        if seconds is None:
            return self.decide(self._reservation(request))
        request = dataclasses.replace(request, priority=rank)
        started = time.monotonic()
        deadline = started + seconds if block else None
        behind = self._join_behind(request, seconds, place=not block)
        if behind is not None:
            return behind if behind.state is not ReservationState.WAITING else self._queued(behind, deadline)
        try:
            made = self.decide(self._reservation(request))
        except OverQuota as refused:
            return self._wait_in_line(request, refused, seconds, block, started)
        if made.state is ReservationState.WAITING:  # its key made it, and it waits still
            return self._await(made, [], deadline)
        return made

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
        return self._reservation(
            self._reserve_request(
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

    def _reserve_request(
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
    ) -> ReserveRequest:
        """The checked request :meth:`reserve` decides; raises what :meth:`reserve` raises for
        its arguments."""
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
        return requests.build(
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
            checks_names=True,
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
        return self._reservation(self._pod_request(request, partition, queue, ttl, key))

    def admit_pod(
        self,
        pod: Any,
        *,
        user: str,
        groups: Iterable[str] = (),
        partition: str = DEFAULT_PARTITION,
        ttl: float | timedelta | None = None,
        dry_run: bool = False,
        timeout: float | None = None,
    ) -> Reservation:
        """Decide a Pod's admission: :meth:`reserve_pod` keyed by its ``metadata.uid``, charged
        to ``user`` and ``groups`` (whoever asked to create it, not what its annotation says).

        The reservation stays pending until the pod is seen stored, or expires after ``ttl``.
        Asking again for the same pod returns the first decision's reservation. With
        ``dry_run`` the same decision runs in a transaction that is rolled back: it raises
        what a real one would raise, or returns the reservation it would have made, and
        nothing is written. ``timeout`` (seconds) bounds the database time, lock waits
        included; past it :class:`DatabaseUnavailable` is raised. A pod without
        ``metadata.uid`` raises :class:`InvalidRequest`.
        """
        validation.partition(partition)
        request = pods.parse_pod(pod)
        if request.uid is None:
            raise InvalidRequest("the pod has no metadata.uid to decide it once by", field="metadata.uid")
        request = dataclasses.replace(
            request, user=validation.name(user, "user"), groups=tuple(validation.names(groups, "groups"))
        )
        self.bounds.request(request.resources, "spec.containers")

        def work(tx: LedgerTx) -> Reservation:
            # The namespace's queue is read in the same transaction, under the same time limit.
            queue = reads.namespace_queue(tx, partition, request.namespace)
            checked = self._pod_request(request, partition, queue, ttl, None)
            return reserve.general(tx, self.rules, self.bounds, checked)

        return self.driver.run(work, timeout=timeout, rollback=dry_run)

    def charge_pod(self, pod: Any, *, partition: str = DEFAULT_PARTITION) -> PodCharge:
        """Charge a Pod the cluster already runs (it was stored, so it counts), over a limit if
        need be: its committed reservation, how it was charged, and the limits it went over.

        Its pending reservation (keyed by ``metadata.uid``, from :meth:`admit_pod` or
        :meth:`reserve_pod`) is committed. A pod without one, or whose reservation ended
        uncommitted (expired, rolled back), is reserved and committed in one transaction with
        no limit refusing it, keyed by :func:`recharge_key` in the latter case. A committed
        reservation is returned as it is. Charging again changes nothing. A pod without
        ``metadata.uid`` raises :class:`InvalidRequest`.
        """
        validation.partition(partition)
        request = pods.parse_pod(pod)
        uid = request.uid
        if uid is None:
            raise InvalidRequest("the pod has no metadata.uid to charge it once by", field="metadata.uid")
        self.bounds.request(request.resources, "spec.containers")
        operation_id = str(uuid.uuid4())

        def commit(tx: LedgerTx, reservation_id: str) -> tuple[Reservation, bool]:
            return resolve.commit_general(tx, self.rules, reservation_id, None, operation_id)

        def work(tx: LedgerTx) -> PodCharge:
            key = uid
            for key in (uid, recharge_key(uid)):
                found = tx.find_reservation_by_key(partition, key)
                if found is None:
                    break
                current = found.reservation
                if current.state is ReservationState.WAITING:
                    # It runs: it no longer waits for the capacity it is charged now.
                    locked = tx.lock_reservation(current.id)
                    if locked is not None and locked[0].reservation.state is ReservationState.WAITING:
                        current = waiting_line.cancel(tx, locked[0].reservation, locked[1])
                if current.state is ReservationState.PENDING:
                    current, expired = commit(tx, current.id)
                    if not expired:
                        return PodCharge(reservation=current, how=Charged.COMMITTED)
                elif current.state is ReservationState.COMMITTED:
                    return PodCharge(reservation=current, how=Charged.ALREADY)
            else:  # both keys used: the second is committed when made, so this is not reached
                raise ReservationStateError(current.id, current.state, "charge")
            queue = reads.namespace_queue(tx, partition, request.namespace)
            overruns: list[Violation] = []
            made = reserve.general(
                tx, self.rules, self.bounds, self._pod_request(request, partition, queue, None, key), overruns
            )
            return PodCharge(
                reservation=commit(tx, made.id)[0], how=Charged.CHARGED, overruns=tuple(overruns)
            )

        return self.driver.run(work)

    def held_keys(self, *, partition: str = DEFAULT_PARTITION) -> dict[str, tuple[str, ReservationState]]:
        """key -> (reservation id, state) of every keyed reservation that still holds something:
        pending, or committed and not released (what a reconciler compares with the pods that
        exist)."""
        validation.partition(partition)
        return self.driver.run(lambda tx: reads.held_keys(tx, partition), read_only=True)

    def _pod_request(
        self,
        request: pods.PodRequest,
        partition: str,
        queue: str,
        ttl: float | timedelta | None,
        key: str | None,
    ) -> ReserveRequest:
        return requests.build(
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

    def get(self, reservation_id: str) -> Reservation:
        """The reservation with this id, as stored now (a waiting one with its ``position``)."""
        return self._placed(validation.reservation_id(reservation_id))

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
        request = self.paths.commit(reservation_id, amounts, str(uuid.uuid4()))
        return Operation(request, resolve.raise_expired, frees="commit" if amounts is not None else None)

    def rollback(self, reservation_id: str) -> Reservation:
        """Release a pending reservation. Rolling back twice, or an expired one, returns it;
        rolling back a committed one raises :class:`ReservationStateError`."""
        return self.decide(self.prepare_rollback(reservation_id))

    def prepare_rollback(self, reservation_id: str) -> Operation[Reservation]:
        """:meth:`rollback` checked but not decided yet (:meth:`decide_all`)."""
        validation.reservation_id(reservation_id)
        return Operation(
            self.paths.rollback(reservation_id),
            frees="rollback",
        )

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
        self._freed(partition, "release")

    def release_reservation(self, reservation_id: str, *, finished: bool = False) -> Reservation:
        """Release everything a committed reservation holds (its pod is gone), once.

        Its committed amounts leave the queue, user, group and application counters, and it
        leaves the ResourceQuotas that count it; ``finished`` ends its application's run. A
        pending reservation is rolled back instead; releasing again returns it unchanged.
        """
        validation.reservation_id(reservation_id)
        validation.flag(finished, "finished")
        operation_id = str(uuid.uuid4())
        return self.decide(
            Operation(self.paths.release_reservation(reservation_id, finished, operation_id), frees="release")
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

    def _reservation(self, request: ReserveRequest) -> Operation[Reservation]:
        finish = None
        if request.checks_names:  # a queue and resources typed by hand (a pod's come from its manifest)
            # The rules this engine compiled last, in memory: a few set lookups when all is known.
            known = self.rules.known(self.driver.run).partition(request.partition)
            said = typos.warnings(known, request.queue, request.resources)
            finish = partial(_warned, said) if said else None
        return Operation(self.paths.reserve(request), finish)


def recharge_key(uid: str) -> str:
    """The key :meth:`Reservations.charge_pod` charges a pod under when the reservation keyed by
    its uid ended uncommitted (the pod was stored after it expired)."""
    return f"{uid}{RECHARGED}"


def _warned(warnings: tuple[str, ...], reservation: Reservation) -> Reservation:
    return dataclasses.replace(reservation, warnings=warnings)
