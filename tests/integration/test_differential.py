"""Differential test: the PostgreSQL set functions against the Python rule they stand in for.

``quota_ledger_reserve_many`` and ``quota_ledger_commit_many`` decide many requests in one call;
every Python path decides one request at a time by :mod:`quota_ledger.model.charges`
(``reserve.general``, ``resolve.commit_general``). For random configurations (queue maxes,
root capacity, user and group limits, maxapplications), random usage and random request lists,
both must decide the same: the function admits exactly the prefix the Python rule admits one
after another (up to its first refusal), hands the callers the same reservations, and leaves
exactly the rows the Python rule leaves (counters, reservations, items, journal, application
rows; not what the clock writes).

Each hypothesis example runs in one transaction on one connection, rolled back at the end: the
configuration is applied and the usage made there (through the ledger's own steps, so every row
is a real one), then each side decides in a savepoint that is rolled back after its rows are read.
The example's own :class:`CompiledRules` reads the configuration that transaction applied. The
call for many is built as a batch builds it, from each request's part (``reserve.by_function_in``,
``commit_function.in_batch``).

Cases a function leaves to the caller for reasons other than a limit are kept out by
construction: no key or id is used twice in a reserve, every resource has a limit at root (so
none is new to the partition), each application belongs to one user and queue and each user has
one set of groups, nothing is rolled back or expires (every application stays running, every
application row is there), and the amounts are far from the bigint range. A commit may name a
reservation twice or one committed before: the function declines those and the rule returns
them as they are, so neither commits them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, currently_in_test_context, event, given, settings
from hypothesis import strategies as st
from sqlalchemy.engine import URL

from quota_ledger import OverQuota, QuotaEngine
from quota_ledger.driver import sql
from quota_ledger.driver.tx import LedgerTx
from quota_ledger.kube import pods
from quota_ledger.ledger import commit_function, configure, reserve, reserve_function, resolve
from quota_ledger.ledger.compiled import CompiledRules
from quota_ledger.model import requests as reserve_requests
from quota_ledger.model import validation
from quota_ledger.model.requests import ReserveRequest
from quota_ledger.model.values import Reservation, ReservationState

PARTITION = "default"
RESOURCES = ("fpga", "memory", "vcore")
#: configured queues, and two that are not (their first use makes their counters)
QUEUES = ("root.a", "root.a.x", "root.a.y", "root.b", "root.c")
#: each user's groups, always the same: an application's group is chosen once
USERS: dict[str | None, tuple[str, ...]] = {None: (), "ann": ("dev",), "bob": ("ops", "dev"), "cy": ()}
TTL = 3600.0
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: examples of each hypothesis test (a longer hunt: QUOTA_LEDGER_DIFFERENTIAL_EXAMPLES=2000)
EXAMPLES = int(os.environ.get("QUOTA_LEDGER_DIFFERENTIAL_EXAMPLES", "100"))

Document = dict[str, Any]
Capacity = dict[str, dict[str, int]]
Snapshot = dict[str, list[tuple[Any, ...]]]


@dataclass(frozen=True)
class Ask:
    """A reserve request, before it is built (a new reservation id each time it is)."""

    queue: str
    resources: Mapping[str, int]
    user: str | None = None
    #: 0: none; n: the user's n-th application in this queue (one user and queue each)
    application: int = 0
    key: str | None = None

    def request(self) -> ReserveRequest:
        usage, scopes = pods.usage_of_resources(self.resources)
        label = self.queue.removeprefix("root.").replace(".", "-")
        return reserve_requests.build(
            partition=PARTITION,
            queue=self.queue,
            resources=dict(self.resources),
            user=self.user,
            groups=USERS[self.user],
            application=f"{self.user or 'anon'}-{label}-{self.application}" if self.application else None,
            ttl=TTL,
            default_ttl=TTL,
            key=self.key,
            kube={"usage": usage, "scopes": scopes.as_dict()},
            namespace=self.queue.rsplit(".", 1)[-1],
            checks_names=True,
        )


@dataclass(frozen=True)
class State:
    """A configuration and the reservations made under it before the requests (committed or not)."""

    document: Document
    capacity: Capacity
    held: tuple[tuple[Ask, bool], ...] = ()


# -- strategies --------------------------------------------------------------------------------
@st.composite
def _maxes(draw: st.DrawFn, above: Mapping[str, int]) -> dict[str, int]:
    names = draw(st.lists(st.sampled_from(RESOURCES), unique=True))
    return {r: draw(st.integers(min(2, above[r]), above[r])) for r in sorted(names)}


@st.composite
def _limit(
    draw: st.DrawFn,
    who: dict[str, list[str]],
    own_max: Mapping[str, int],
    own_apps: int,
    above: Mapping[str, int] | None = None,
    above_apps: int = 0,
) -> dict[str, Any]:
    """A user or group limit that fits its queue's max and maxapplications and the same name's
    limit above it (YuniKorn's checks)."""
    names = draw(st.lists(st.sampled_from(RESOURCES), unique=True))
    bound = {r: min(own_max.get(r, 10), (above or {}).get(r, 10)) for r in names}
    resources = {r: draw(st.integers(1, bound[r])) for r in sorted(names)}
    apps_bound = min((n for n in (above_apps, own_apps) if n), default=0)
    # under a name's maxapplications a limit of the same name sets one too (0 is unlimited)
    apps = draw(st.integers(1, apps_bound)) if above_apps else draw(st.integers(0, apps_bound or 3))
    if not resources and not apps:
        apps = apps_bound or 1
    limit: dict[str, Any] = dict(who)
    if resources:
        limit["maxresources"] = resources
    if apps:
        limit["maxapplications"] = apps
    return limit


def _queue(name: str, maximum: Mapping[str, int], apps: int, limits: list[dict[str, Any]]) -> dict[str, Any]:
    queue: dict[str, Any] = {"name": name}
    if maximum:
        queue["resources"] = {"max": dict(maximum)}
    if apps:
        queue["maxapplications"] = apps
    if limits:
        queue["limits"] = limits
    return queue


@st.composite
def configurations(draw: st.DrawFn) -> tuple[Document, Capacity]:
    """root.a (with root.a.x under it) and root.b: random maxes under a capacity at root that
    names every resource, maxapplications, user wildcard limits (on root.a, root.a.x and root.b),
    a limit of user bob (on root.b) and limits of groups dev (on root.a) and ops (on root.b)."""
    capacity = {r: draw(st.integers(6, 30)) for r in RESOURCES}
    a_max = draw(_maxes(capacity))
    x_max = draw(_maxes({**capacity, **a_max}))
    b_max = draw(_maxes(capacity))
    a_apps = draw(st.sampled_from((0, 0, 1, 2, 3)))
    x_apps = draw(st.integers(1, a_apps)) if a_apps else draw(st.sampled_from((0, 0, 1, 2)))
    b_apps = draw(st.sampled_from((0, 0, 1, 2)))
    a_limits: list[dict[str, Any]] = []
    x_limits: list[dict[str, Any]] = []
    b_limits: list[dict[str, Any]] = []
    if draw(st.booleans()):
        a_limits.append(draw(_limit({"groups": ["dev"]}, a_max, a_apps)))
    if draw(st.booleans()):
        users = draw(_limit({"users": ["*"]}, a_max, a_apps))
        a_limits.append(users)
        if draw(st.booleans()):
            x_limits.append(
                draw(
                    _limit(
                        {"users": ["*"]},
                        x_max,
                        x_apps,
                        users.get("maxresources", {}),
                        users.get("maxapplications", 0),
                    )
                )
            )
    for who in ({"groups": ["ops"]}, {"users": ["bob"]}, {"users": ["*"]}):  # the wildcard comes last
        if draw(st.booleans()):
            b_limits.append(draw(_limit(who, b_max, b_apps)))
    a = _queue("a", a_max, a_apps, a_limits)
    a["queues"] = [_queue("x", x_max, x_apps, x_limits)]
    root = {"name": "root", "queues": [a, _queue("b", b_max, b_apps, b_limits)]}
    return {"partitions": [{"name": PARTITION, "queues": [root]}]}, {PARTITION: capacity}


@st.composite
def asks(draw: st.DrawFn) -> Ask:
    names = draw(st.lists(st.sampled_from(RESOURCES), min_size=1, max_size=len(RESOURCES), unique=True))
    return Ask(
        queue=draw(st.sampled_from(QUEUES)),
        resources={r: draw(st.sampled_from((1, 1, 2, 2, 3, 4, 6, 9))) for r in sorted(names)},
        user=draw(st.sampled_from((None, "ann", "bob", "cy"))),
        application=draw(st.sampled_from((0, 0, 1, 2))),
    )


def _keyed(found: Sequence[Ask], keys: Sequence[bool], prefix: str) -> tuple[Ask, ...]:
    """``found`` with a key of its own where ``keys`` says so (never a key used before)."""
    return tuple(
        Ask(a.queue, a.resources, a.user, a.application, f"{prefix}{n}" if keyed else None)
        for n, (a, keyed) in enumerate(zip(found, keys, strict=True))
    )


@st.composite
def states(draw: st.DrawFn, min_held: int = 0) -> State:
    document, capacity = draw(configurations())
    held = draw(
        st.lists(st.tuples(asks(), st.sampled_from((False, False, True))), min_size=min_held, max_size=6)
    )
    keys = draw(st.lists(st.booleans(), min_size=len(held), max_size=len(held)))
    made = _keyed([a for a, _ in held], keys, "held-")
    return State(document, capacity, tuple(zip(made, (c for _, c in held), strict=True)))


@st.composite
def request_lists(draw: st.DrawFn) -> tuple[Ask, ...]:
    found = draw(st.lists(asks(), min_size=1, max_size=8))
    return _keyed(found, draw(st.lists(st.booleans(), min_size=len(found), max_size=len(found))), "new-")


# -- the state of an example ---------------------------------------------------------------------
def prepare(tx: LedgerTx, bounds: validation.Bounds, state: State) -> tuple[CompiledRules, list[Reservation]]:
    """Apply the state's configuration and make its reservations (committing those it says)
    inside ``tx``; the rules that read it, and the reservations made (a refused one is not)."""

    def edit(document: Document, capacity: Capacity) -> tuple[Any, Capacity]:
        return state.document, state.capacity

    version = configure.apply(tx, edit, bounds=bounds)
    rules = CompiledRules()  # this example's configuration version, never another's
    assert rules.in_force(tx).version == version
    made = []
    for ask, commit in state.held:
        savepoint = tx.conn.begin_nested()
        try:
            reservation = reserve.general(tx, rules, bounds, ask.request())
        except OverQuota:
            savepoint.rollback()
            continue
        if commit:
            done, expired = resolve.commit_general(tx, rules, reservation.id, None, "held")
            assert not expired
            assert done.state is ReservationState.COMMITTED
        savepoint.commit()
        made.append(reservation)
    return rules, made


_JSON_COLUMNS = {"groups", "kube", "usage"}
_TABLES = {
    "quota_usages": (
        "SELECT partition, scope_type, scope, resource, in_use, reserved, hard_limit FROM quota_usages"
    ),
    "quota_identity_usages": (
        "SELECT partition, kind, name, queue, resource, in_use, reserved, hard_limit"
        " FROM quota_identity_usages"
    ),
    "reservations": (
        'SELECT id, partition, "key", request_hash, state, queue, user_name, "groups", application,'
        " priority_class, kube, expires_at - created_at AS ttl, resolved_at IS NULL AS unresolved,"
        " released_at IS NULL AS unreleased, priority, queued_at IS NULL AS unqueued, ttl_ms, blocked_by"
        " FROM reservations"
    ),
    "reservation_items": "SELECT reservation_id, resource, amount, committed FROM reservation_items",
    "quota_journal": (
        "SELECT partition, queue, resource, delta, kind, reservation_id, operation_id FROM quota_journal"
    ),
    # an application's area integrates its usage over time, and its times are the clock's
    "quota_applications": (
        "SELECT partition, app_key, application, user_name, queue, group_name, state, pending, usage,"
        " started_at IS NULL AS unstarted, finished_at IS NULL AS unfinished FROM quota_applications"
    ),
    "quota_app_summaries": "SELECT partition, application FROM quota_app_summaries",
    "quota_partitions": "SELECT name FROM quota_partitions",
}


def snapshot(tx: LedgerTx) -> Snapshot:
    """Every row the ledger keeps, without what depends on the clock (ids of serial rows
    neither), each table's rows sorted; JSON columns parsed."""
    found: Snapshot = {}
    for table, query in _TABLES.items():
        result = tx.conn.exec_driver_sql(query)
        columns = list(result.keys())
        table_rows = [
            tuple(
                _parsed(value) if column in _JSON_COLUMNS and value is not None else value
                for column, value in zip(columns, row, strict=True)
            )
            for row in result
        ]
        found[table] = sorted(table_rows, key=repr)
    return found


def _parsed(text: str) -> str:
    return json.dumps(json.loads(text), sort_keys=True)


def counters(rows: Snapshot) -> Snapshot:
    return {t: rows[t] for t in ("quota_usages", "quota_identity_usages")}


def _event(text: str) -> None:
    """Count ``text`` in the statistics of the hypothesis test running (none: a fixed example)."""
    if currently_in_test_context():
        event(text)


def _tell(decided: Sequence[int], asked: int, before: Snapshot, after: Snapshot) -> None:
    """What an example exercised (``--hypothesis-show-statistics``)."""
    _event(f"decided {'all' if len(decided) == asked else 'none' if not decided else 'some'}")
    for table, what in (
        ("quota_usages", "queue counter"),
        ("quota_identity_usages", "user/group counter"),
        ("quota_applications", "application row"),
    ):
        keys = {row[:-3] if table != "quota_applications" else row[:2] for row in before[table]}
        changed = set(after[table]) - set(before[table])
        if any((row[:-3] if table != "quota_applications" else row[:2]) not in keys for row in changed):
            _event(f"a new {what}")
        elif changed:
            _event(f"a {what} changed")
    if any(row[3] == "applications" for row in set(after["quota_usages"]) - set(before["quota_usages"])):
        _event("a running application counted")


# -- reserves ------------------------------------------------------------------------------------
def by_one_call(tx: LedgerTx, planned: Sequence[Any]) -> dict[int, Any]:
    """What one call for many decided, built as a batch builds it from its requests' parts
    (a ``ByFunction`` each; see :mod:`quota_ledger.ledger.group_decision`): the place (1-based) of
    each request it decided, which ends its row, and the outcome the batch hands that request's
    caller."""
    assert all(plan is not None for plan in planned), "every request has a function call"
    assert all(plan.group == planned[0].group for plan in planned), "one call decides them all"
    call = planned[0].build([plan.params for plan in planned])
    return {
        row[-1]: planned[row[-1] - 1].finish([row]) for row in tx.conn.exec_driver_sql(call.sql, call.params)
    }


def timeless(reservation: Reservation) -> Reservation:
    """``reservation`` with its times (the clock's) moved to the epoch, its time to live kept."""
    return replace(
        reservation,
        created_at=EPOCH,
        expires_at=EPOCH + (reservation.expires_at - reservation.created_at),
        resolved_at=None if reservation.resolved_at is None else EPOCH,
        released_at=None if reservation.released_at is None else EPOCH,
    )


def reserve_by_function(
    tx: LedgerTx, rules: CompiledRules, requests: Sequence[ReserveRequest]
) -> dict[int, Reservation]:
    """What one ``quota_ledger_reserve_many`` call admits: each place, with its reservation."""
    made = by_one_call(tx, [reserve_function.in_batch(tx, rules, request) for request in requests])
    return {place: timeless(reservation) for place, reservation in made.items()}


def reserve_by_rule(
    tx: LedgerTx, rules: CompiledRules, bounds: validation.Bounds, requests: Sequence[ReserveRequest]
) -> dict[int, Reservation]:
    """What the general path admits one after another, up to its first refusal (each in a
    savepoint, as a batch runs it)."""
    admitted = {}
    for place, request in enumerate(requests, 1):
        savepoint = tx.conn.begin_nested()
        try:
            reservation = reserve.general(tx, rules, bounds, request)
        except OverQuota:
            savepoint.rollback()
            break
        savepoint.commit()
        admitted[place] = timeless(reservation)
    return admitted


def check_reserves(
    tx: LedgerTx,
    bounds: validation.Bounds,
    state: State,
    found: Sequence[Ask],
) -> None:
    """Decide ``found`` after ``state`` by one call and by the rule: the same places admitted
    (a prefix) and the same rows left."""
    rules, _ = prepare(tx, bounds, state)
    requests = [ask.request() for ask in found]
    before = snapshot(tx)
    savepoint = tx.conn.begin_nested()
    by_function = reserve_by_function(tx, rules, requests)
    function_rows = snapshot(tx)
    savepoint.rollback()
    assert snapshot(tx) == before
    savepoint = tx.conn.begin_nested()
    by_rule = reserve_by_rule(tx, rules, bounds, requests)
    rule_rows = snapshot(tx)
    savepoint.rollback()
    _tell(list(by_rule), len(requests), before, rule_rows)
    assert sorted(by_function) == sorted(by_rule), "the function admitted other places than the rule"
    assert sorted(by_function) == list(range(1, len(by_function) + 1)), "the function admitted no prefix"
    assert by_function == by_rule, "the reservations differ"
    assert counters(function_rows) == counters(rule_rows), "the counters differ"
    assert function_rows == rule_rows, "the rows differ"


# -- commits -------------------------------------------------------------------------------------
def commit_by_function(tx: LedgerTx, ids: Sequence[str]) -> dict[int, Reservation]:
    """What one ``quota_ledger_commit_many`` call commits: each place, with its reservation."""
    done = by_one_call(tx, [commit_function.in_batch(tx, rid, f"op-{n}") for n, rid in enumerate(ids, 1)])
    found = {}
    for place, (reservation, expired) in done.items():
        assert not expired
        found[place] = timeless(reservation)
    return found


def _state_of(tx: LedgerTx, reservation_id: str) -> str:
    state: str = tx.conn.exec_driver_sql(
        "SELECT state FROM reservations WHERE id = %(id)s", {"id": reservation_id}
    ).scalar_one()
    return state


def commit_by_rule(tx: LedgerTx, rules: CompiledRules, ids: Sequence[str]) -> dict[int, Reservation]:
    """What ``commit_general`` one after another commits: each place where it moved a pending
    reservation to committed (a repeat, or one committed before, is returned as it is), with
    the reservation."""
    committed = {}
    for place, rid in enumerate(ids, 1):
        was = _state_of(tx, rid)
        done, expired = resolve.commit_general(tx, rules, rid, None, f"op-{place}")
        assert not expired
        assert done.state is ReservationState.COMMITTED
        if was == "pending":
            committed[place] = timeless(done)
    return committed


def check_commits(tx: LedgerTx, bounds: validation.Bounds, state: State, picks: Sequence[int]) -> None:
    """Commit the reservations ``picks`` names among those ``state`` made (by index, repeats
    included) by one call and by the rule: the same places committed, the same rows left."""
    rules, made = prepare(tx, bounds, state)
    assume(made)
    ids = [made[p % len(made)].id for p in picks]
    before = snapshot(tx)
    savepoint = tx.conn.begin_nested()
    by_function = commit_by_function(tx, ids)
    function_rows = snapshot(tx)
    savepoint.rollback()
    assert snapshot(tx) == before
    savepoint = tx.conn.begin_nested()
    by_rule = commit_by_rule(tx, rules, ids)
    rule_rows = snapshot(tx)
    savepoint.rollback()
    _tell(list(by_rule), len(ids), before, rule_rows)
    assert sorted(by_function) == sorted(by_rule), "the function committed other places than the rule"
    assert by_function == by_rule, "the reservations differ"
    assert counters(function_rows) == counters(rule_rows), "the counters differ"
    assert function_rows == rule_rows, "the rows differ"


# -- the tests -----------------------------------------------------------------------------------
@pytest.fixture
def ledger(postgres_url: URL) -> Iterator[QuotaEngine]:
    engine = QuotaEngine.from_url(postgres_url, pool_size=2)
    yield engine
    engine.close()


#: root.a, configured without limits of its own
_ONE_QUEUE: Document = {
    "partitions": [{"name": PARTITION, "queues": [{"name": "root", "queues": [{"name": "a"}]}]}]
}


# Every example runs in a transaction of its own that is rolled back: the database the fixture
# made serves them all.
_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)


@_SETTINGS
@given(state=states(), found=request_lists())
def test_reserve_many_decides_as_the_rule(ledger: QuotaEngine, state: State, found: tuple[Ask, ...]) -> None:
    ledger.driver.run(lambda tx: check_reserves(tx, ledger.bounds, state, found), rollback=True)


@_SETTINGS
@given(state=states(min_held=1), picks=st.lists(st.integers(0, 7), min_size=1, max_size=8))
def test_commit_many_decides_as_the_rule(ledger: QuotaEngine, state: State, picks: list[int]) -> None:
    ledger.driver.run(lambda tx: check_commits(tx, ledger.bounds, state, picks), rollback=True)


def test_a_refused_new_application_leaves_no_row(ledger: QuotaEngine) -> None:
    # The first request fits root's 3 exactly; the second starts an application and goes over.
    # One after another the second leaves nothing; the call must not leave its application row
    # (it once did: the first request's missing application key made the cleanup's test NULL).
    state = State(document=_ONE_QUEUE, capacity={PARTITION: {"fpga": 3}})
    found = [Ask("root.a", {"fpga": 3}), Ask("root.a", {"fpga": 1}, user="ann", application=1)]
    ledger.driver.run(lambda tx: check_reserves(tx, ledger.bounds, state, found), rollback=True)


# -- the test has teeth ----------------------------------------------------------------------------
#: root.a allows 5 fpga: a request of exactly 5 fits (equality is allowed)
AT_THE_LIMIT = State(document=_ONE_QUEUE, capacity={PARTITION: {"fpga": 5}})
#: the comparison of a running total with a counter's limit, as reserve_many.sql writes it
LIMIT_TEST = "l.used + r.total > l.cap"


def test_a_function_that_refuses_at_the_limit_is_caught(ledger: QuotaEngine) -> None:
    # The rule admits a request that brings a counter exactly to its limit. A copy of the function
    # that refuses it (>= for >), installed in a transaction that is rolled back, must fail the
    # differential check, and the function as it is must pass the same check.
    definition = sql.definition("reserve_many")
    assert definition.count(LIMIT_TEST) == 1, "the mutation below no longer applies: update LIMIT_TEST"
    mutated = definition.replace(LIMIT_TEST, LIMIT_TEST.replace(">", ">="))
    found = [Ask("root.a", {"fpga": 5})]

    def check(tx: LedgerTx) -> None:
        check_reserves(tx, ledger.bounds, AT_THE_LIMIT, found)
        tx.conn.exec_driver_sql(mutated)
        with pytest.raises(AssertionError, match="other places than the rule"):
            check_reserves(tx, ledger.bounds, AT_THE_LIMIT, found)

    ledger.driver.run(check, rollback=True)
