"""Reserve: one transaction that checks every limit on the way to root and holds the request.

The general path (:func:`general`, a transaction of steps on :class:`LedgerTx`) locks the
counters a request is charged to and asks the rule (:mod:`quota_ledger.model.charges`). On
PostgreSQL ``quota_ledger_reserve_many`` may decide first, for the request alone or with its
batch: which ResourceQuotas it is charged to, its group and the user/group counters that
enforce it (with the limits a missing one is created with) are decided here from the
configuration the engine last compiled (:func:`function_params`), and the function checks
under the partition lock that this configuration is still in force. What it declines (listed
in :mod:`quota_ledger.driver.pg_functions`), the general path decides.

The general path creates the counters it needs in its own transaction, in the lock order of
:mod:`quota_ledger.driver.tx`: the queue counters after locking those that exist, the
user/group counters after the limits. A refusal rolls the inserts back with the rest, so a
refused request leaves no trace.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from quota_ledger.config import typos
from quota_ledger.config.rules import PartitionRules, Rules
from quota_ledger.driver import pg_functions
from quota_ledger.driver.core import DbQuotaDriver
from quota_ledger.driver.tx import LedgerTx
from quota_ledger.ledger import applications, resource_quotas
from quota_ledger.ledger.compiled import CompiledRules
from quota_ledger.ledger.group_decision import ByFunction
from quota_ledger.model import arguments, charges, queues, tracking, validation
from quota_ledger.model.counters import Counter
from quota_ledger.model.errors import InvalidRequest, MissingCoveringQuota, PodMissingResources
from quota_ledger.model.quantity import APPLICATIONS
from quota_ledger.model.requests import Identity, ReserveRequest
from quota_ledger.model.tracking import AppState
from quota_ledger.model.values import Reservation, Violation


def refusal(rules: PartitionRules, request: ReserveRequest) -> InvalidRequest | None:
    """The error of a request naming what its partition's configuration does not know, where
    the partition refuses such names (:mod:`quota_ledger.config.typos`); None otherwise. Every
    path asks it of the rules it decides with; the function paths and sets leave a refused
    request to the general path, which raises it under the partition lock."""
    if not request.checks_names or not rules.refuses_unknown_names:
        return None
    return typos.in_request(rules, request.queue, request.resources).refusal()


def by_function_or_general(
    driver: DbQuotaDriver, rules: CompiledRules, bounds: validation.Bounds, request: ReserveRequest
) -> Reservation:
    """Reserve ``request`` alone by the server function, or by the general path where the
    function declines (:mod:`.paths` chooses this for PostgreSQL); raises the refusal."""
    created = _by_function(driver, rules.known(driver.run), request)
    if created is not None:
        return request.pending(created)
    # Declined: nothing was written, unless a lost connection hid our own commit; then the
    # insert of the general path meets our id and its retry finds the reservation.
    return driver.run(lambda tx: general(tx, rules, bounds, request))


# -- the general path --------------------------------------------------------------------------
def general(
    tx: LedgerTx,
    rules: CompiledRules,
    bounds: validation.Bounds,
    request: ReserveRequest,
    overruns: list[Violation] | None = None,
) -> Reservation:
    """The general path's transaction.

    With ``overruns`` nothing is refused for a limit: the limits it breaks are appended to that
    list instead (charging what already runs, :meth:`QuotaEngine.charge_pod`). Only this path
    takes it; the function and set paths always refuse."""
    partition, queue, positive = request.partition, request.queue, request.resources
    if request.key is not None and (found := tx.find_reservation_by_key(partition, request.key)):
        return arguments.same_request(found, partition, request.key, request.request_hash)
    if tx.attempt and (found := tx.find_reservation(request.reservation_id)):
        return found.reservation  # the first attempt committed before the connection dropped
    now = tx.lock_partition(partition, exclusive=False)
    in_force = rules.partition(tx, partition)
    if (refused := refusal(in_force, request)) is not None:
        raise refused
    if overruns is None:
        quotas = resource_quotas.admit(in_force, queue, request.namespace, request.kube, request.missing)
    else:  # it runs already: charged to the quotas it matches, covered or not
        quotas = resource_quotas.matching(in_force, queue, request.kube)
    reservation = request.pending(now)
    # Write our own new rows first and lock the shared counters last, so they are held only
    # for check, update and commit.
    tx.insert_reservation(reservation, request.request_hash, request.kube)
    if not positive:
        tx.ensure_partition(partition, now)  # no counters will name it; the sweeper must
    app: AppState | None = None
    if applications.tracked(request.user, request.application):
        app = applications.open_app(
            tx,
            in_force,
            partition=partition,
            queue=queue,
            user=request.user,
            groups=request.groups,
            application=request.application,
            now=now,
        )
        tracking.add_reserved(app, positive)
        applications.save(tx, app)
    # A new application counts against every maxapplications on its way to root.
    requested = {**positive, APPLICATIONS: 1} if app is not None and app.started_now else positive
    checked = app is not None or bool(quotas) or overruns is not None
    own = _lock_own(tx, bounds, request, requested, checked=checked, now=now)
    limits = tx.lock_subtree_counters(partition, queues.lineage(queue), requested)
    scoped = applications.lock_for_reserve(tx, in_force, app, requested, now) if app is not None else []
    quota_usage: dict[str, int] = request.kube["usage"]
    charged = resource_quotas.lock(tx, partition, queue, quotas, quota_usage)
    counters = [*own, *limits, *scoped, *charged]
    ask = charges.Ask(partition, charges.reserving(counters, requested, quota_usage), overruns is None)
    decision = charges.decide_one(ask).admit()
    if overruns is not None:
        overruns += decision.violations
    tx.apply_charges(decision.deltas, now)
    return reservation


def _lock_own(
    tx: LedgerTx,
    bounds: validation.Bounds,
    request: ReserveRequest,
    requested: Mapping[str, int],
    *,
    checked: bool,
    now: datetime,
) -> list[Counter]:
    """Lock the queue's own counters of the request, creating those used for the first time.

    ``checked``: user, group or quota limits are in play, which are checked (all together, so
    that a refusal lists every broken limit) once the counters are locked. Without them the
    queue limits are read first and a request they refuse is refused before any insert.
    """
    partition = request.partition
    pairs = [(request.queue, r) for r in request.resources]
    savepoint = tx.savepoint()
    own = tx.lock_queue_counters(partition, pairs)
    if savepoint is not None:
        if len(own) == len(pairs):
            savepoint.commit()
        else:
            # Let go of the counters just locked (PostgreSQL): the missing ones are inserted
            # while this transaction holds no counter, then all are locked in order.
            savepoint.rollback()
    if len(own) < len(pairs):
        if not checked:
            chain = queues.lineage(request.queue)
            unlocked = tx.lock_subtree_counters(partition, chain, requested, lock=False)
            charges.decide_one(charges.Ask(partition, charges.reserving(unlocked, requested))).admit()
        # Only a resource the partition names nowhere yet can bring it over its bound of names.
        if tx.unnamed_resources(partition, request.resources):
            bounds.partition(tx.resource_names(partition) | set(request.resources), partition)
        # The partition's row first (PostgreSQL; elsewhere the partition lock made it): no
        # counter of a partition without its row exists for us to hold while we wait on it.
        tx.ensure_partition(partition, now)
        tx.insert_queue_counters(partition, sorted(set(pairs) - own.keys()), now)
        own = tx.lock_queue_counters(partition, pairs)
    return list(own.values())


# -- the PostgreSQL function path --------------------------------------------------------------
def quota_charges(rules: Rules, request: ReserveRequest) -> list[tuple[str, str, int]] | None:
    """The (quota, resource, amount) charges of a request under ``rules``, or None when the
    admission rules or the partition's unknown names refuse it: the general path then decides
    again under the partition lock (these ``rules`` may be out of date) and raises the refusal."""
    if refusal(rules.partition(request.partition), request) is not None:
        return None
    try:
        quotas = resource_quotas.admit(
            rules.partition(request.partition),
            request.queue,
            request.namespace,
            request.kube,
            request.missing,
        )
    except (MissingCoveringQuota, PodMissingResources):
        return None
    usage: Mapping[str, int] = request.kube["usage"]
    return [(key, name, usage[name]) for key, name in sorted(resource_quotas.charged_keys(quotas, usage))]


def identity_of(rules: Rules, request: ReserveRequest) -> Identity:
    """The application row and user/group counters a request is charged to, as the general
    path would find them: a new named application also counts against its user's and group's
    maxapplications (the function charges those only when it starts the application), and
    a missing counter is created with the limit given here."""
    user, application, groups = request.user, request.application, request.groups
    if user is None and application is None:
        return Identity(groups=groups)
    found = rules.partition(request.partition)
    group = applications.group_for(found, request.queue, user, groups)
    requested = {**request.resources, APPLICATIONS: 1} if application is not None else request.resources
    limits = applications.identity_limits(found, request.queue, user, group, requested)
    return Identity(
        user=user,
        groups=groups,
        application=application,
        app_key=tracking.app_key(application, user, request.queue),
        group=group,
        counters=tuple((*key, requested[key[3]], limits[key]) for key in sorted(limits)),
    )


def _by_function(driver: DbQuotaDriver, rules: Rules, request: ReserveRequest) -> datetime | None:
    """Reserve in one call of ``ledger_reserve_many`` for this request alone; the database clock
    it was created at, or None when the function declined (nothing was written) or the admission
    rules may refuse it."""
    params = function_params(rules, request)
    if params is None:
        return None
    call = pg_functions.reserve_many([params])
    rows = driver.call(call.sql, call.params)
    if not rows:
        return None
    created: datetime = rows[0][0]
    return created


def function_params(rules: Rules, request: ReserveRequest) -> dict[str, Any] | None:
    """The request's part of a ``ledger_reserve_many`` call under ``rules``, or None when the
    general path must decide it (see :mod:`quota_ledger.driver.pg_functions`)."""
    quota_charged = quota_charges(rules, request)
    if quota_charged is None:
        return None
    return pg_functions.reserve_params(request, rules.version, quota_charged, identity_of(rules, request))


# -- in a batch (group commit) -----------------------------------------------------------------
def by_function_in(
    tx: LedgerTx, rules: CompiledRules, request: ReserveRequest
) -> ByFunction[Reservation] | None:
    """How ``ledger_reserve_many`` may reserve ``request`` with the batch's other reserves of its
    partition; None off PostgreSQL or when the general path must decide it."""
    if tx.pg is None or not request.resources:
        return None
    known = rules.known(lambda step: step(tx))
    params = function_params(known, request)
    if params is None:
        return None

    def finish(rows: list[Any]) -> Reservation | None:
        created: datetime | None = rows[0][0]
        return None if created is None else request.pending(created)

    # the requests of one partition and configuration version are reserved together
    group = ("reserve", request.partition, known.version)
    return ByFunction(group, params, pg_functions.reserve_many, finish)
