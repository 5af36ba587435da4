"""Reserve by PostgreSQL's ``quota_ledger_reserve_many``: a request alone, or with its batch.

Which ResourceQuotas a request is charged to, its group and the user/group counters that
enforce it (with the limits a missing one is created with) are decided here from the
configuration the engine last compiled; the function checks under the partition lock that this
configuration is still in force. What it declines (listed in
:mod:`quota_ledger.driver.pg_functions`), the rule's path (:func:`.reserve.general`) decides.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from quota_ledger.config.rules import Rules
from quota_ledger.driver import pg_functions
from quota_ledger.driver.core import DbQuotaDriver
from quota_ledger.driver.tx import LedgerTx
from quota_ledger.ledger import applications, reserve, resource_quotas
from quota_ledger.ledger.compiled import CompiledRules
from quota_ledger.ledger.group_decision import ByFunction
from quota_ledger.model import tracking, validation
from quota_ledger.model.errors import MissingCoveringQuota, PodMissingResources
from quota_ledger.model.quantity import APPLICATIONS
from quota_ledger.model.requests import Identity, ReserveRequest
from quota_ledger.model.values import Reservation


def by_function_or_general(
    driver: DbQuotaDriver, rules: CompiledRules, bounds: validation.Bounds, request: ReserveRequest
) -> Reservation:
    """Reserve ``request`` alone by the server function, or by the rule's path where the
    function declines (:mod:`.paths` chooses this for PostgreSQL); raises the refusal."""
    created = _alone(driver, rules.known(driver.run), request)
    if created is not None:
        return request.pending(created)
    # Declined: nothing was written, unless a lost connection hid our own commit; then the
    # insert of the rule's path meets our id and its retry finds the reservation.
    return driver.run(lambda tx: reserve.general(tx, rules, bounds, request))


def quota_charges(rules: Rules, request: ReserveRequest) -> list[tuple[str, str, int]] | None:
    """The (quota, resource, amount) charges of a request under ``rules``, or None when the
    admission rules or the partition's unknown names refuse it: the rule's path then decides
    again under the partition lock (these ``rules`` may be out of date) and raises the refusal."""
    if reserve.refusal(rules.partition(request.partition), request) is not None:
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
    """The application row and user/group counters a request is charged to, as the rule's path
    would find them: a new named application also counts against its user's and group's
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


def params(rules: Rules, request: ReserveRequest) -> dict[str, Any] | None:
    """The request's part of a ``ledger_reserve_many`` call under ``rules``, or None when the
    rule's path must decide it (see :mod:`quota_ledger.driver.pg_functions`)."""
    quota_charged = quota_charges(rules, request)
    if quota_charged is None:
        return None
    return pg_functions.reserve_params(request, rules.version, quota_charged, identity_of(rules, request))


def _alone(driver: DbQuotaDriver, rules: Rules, request: ReserveRequest) -> datetime | None:
    """Reserve in one call of ``ledger_reserve_many`` for this request alone; the database clock
    it was created at, or None when the function declined (nothing was written) or the admission
    rules may refuse it."""
    found = params(rules, request)
    if found is None:
        return None
    call = pg_functions.reserve_many([found])
    rows = driver.call(call.sql, call.params)
    if not rows:
        return None
    created: datetime = rows[0][0]
    return created


def in_batch(tx: LedgerTx, rules: CompiledRules, request: ReserveRequest) -> ByFunction[Reservation] | None:
    """How ``ledger_reserve_many`` may reserve ``request`` with the batch's other reserves of its
    partition; None off PostgreSQL or when the rule's path must decide it."""
    if tx.pg is None or not request.resources:
        return None
    known = rules.known(lambda step: step(tx))
    found = params(known, request)
    if found is None:
        return None

    def finish(rows: list[Any]) -> Reservation | None:
        created: datetime | None = rows[0][0]
        return None if created is None else request.pending(created)

    # the requests of one partition and configuration version are reserved together
    group = ("reserve", request.partition, known.version)
    return ByFunction(group, found, pg_functions.reserve_many, finish)
