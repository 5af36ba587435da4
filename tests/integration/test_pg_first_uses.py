"""First uses on PostgreSQL run in ``quota_ledger_reserve`` (migration 0010).

A new queue, a new application, a new user under a wildcard user limit and a new group under a
wildcard group limit: the function creates the rows the general path would create, in the same
transaction, refuses what the general path refuses (by declining: the general path then raises
the refusal), and many threads making the same first use at once neither break a limit nor
duplicate a row nor see a deadlock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from ledger_dump import dump
from sqlalchemy.engine import URL
from test_pg_functions import Calls, identity_snapshot, rows, snapshot

from quota_ledger import OverQuota, QuotaEngine, QuotaLedgerError

#: threads making the same first use at once (each holds a connection of a shared server)
THREADS = 8
CONFIG = """
partitions:
- name: {partition}
  queues:
  - name: root
    queues:
    - name: org
      maxapplications: 10
      resources: {{max: {{fpga: 40, memory: 40Gi}}}}
      limits:
      - users: ["*"]
        maxresources: {{fpga: 6, memory: 8Gi}}
        maxapplications: 2
      - groups: [dev]
        maxresources: {{fpga: 10}}
      - groups: ["*"]
        maxresources: {{fpga: 12, memory: 6Gi}}
        maxapplications: 3
      queues:
      - name: team
        maxapplications: 4
        resources: {{max: {{fpga: 20}}}}
        limits:
        - users: ["*"]
          maxresources: {{fpga: 5}}
          maxapplications: 2
"""


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Calls:
    return Calls(monkeypatch)


def configured(url: URL, partition: str = "default", *, functions: bool = True) -> QuotaEngine:
    engine = QuotaEngine.from_url(url, pool_size=THREADS + 2)
    engine.apply_config(CONFIG.format(partition=partition), allow_removing_all=True)
    engine.driver.functions = functions
    return engine


def first_uses(engine: QuotaEngine, partition: str) -> None:
    """A first use of each kind, and uses of what they created."""
    kw: dict[str, Any] = {"partition": partition, "ttl": 300}
    engine.commit(engine.reserve("root.org.new", {"fpga": 1, "memory": "1Gi"}, **kw).id)  # queue
    engine.commit(engine.reserve("root.org.new", {"fpga": 1}, **kw).id)
    # a new user under the wildcards (a bucket: no application), in a new queue too
    engine.commit(engine.reserve("root.org.team.x", {"fpga": 1}, user="ann", groups=["dev"], **kw).id)
    # a new application of that user: maxapplications on root.org, root.org.team, ann's, dev has none
    app = engine.reserve("root.org.team", {"fpga": 2}, user="ann", groups=["dev"], application="a1", **kw)
    engine.commit(app.id)
    engine.rollback(
        engine.reserve("root.org.team", {"fpga": 1}, user="ann", groups=["dev"], application="a1", **kw).id
    )
    # a new user whose group is tracked against the shared wildcard group, with an application
    engine.commit(
        engine.reserve("root.org", {"memory": "1Gi"}, user="bob", groups=["ops"], application="b1", **kw).id
    )
    # a new application that starts without a commit, then rolled back: it stops again
    engine.rollback(
        engine.reserve("root.org", {"fpga": 1}, user="cat", groups=["x"], application="c1", **kw).id
    )


def test_first_uses_run_in_the_function_and_leave_the_general_paths_rows(
    postgres_url: URL, calls: Calls
) -> None:
    # a configuration covers every partition: each story runs under its own
    fast = configured(postgres_url, "fast")
    try:
        first_uses(fast, "fast")
        fast_rows = {
            "usage": snapshot(postgres_url, "fast"),
            "identity": identity_snapshot(postgres_url, "fast"),
        }
        assert fast.audit(partition="fast") == []
    finally:
        fast.close()
    general = configured(postgres_url, "general", functions=False)
    try:
        first_uses(general, "general")
        general_rows = {
            "usage": snapshot(postgres_url, "general"),
            "identity": identity_snapshot(postgres_url, "general"),
        }
    finally:
        general.close()
    assert calls.made.count("quota_ledger_reserve") == 7
    assert calls.declined == []
    assert fast_rows == general_rows
    names = {(kind, name) for kind, name, *_ in fast_rows["identity"]["counters"]}
    assert {("user", "ann"), ("user", "bob"), ("user", "cat"), ("group", "*")} <= names
    assert ("queue", "root.org.team.x", "fpga") in {row[:3] for row in fast_rows["usage"]["counters"]}
    assert len(fast_rows["identity"]["apps"]) == 4  # ann's bucket, a1, b1, c1


def _refusals(engine: QuotaEngine) -> list[type[Exception]]:
    """First uses that break a limit: each must be refused and leave no trace."""
    found: list[type[Exception]] = []
    attempts: list[Callable[[], object]] = [
        # a new queue over the limit of its parent
        lambda: engine.reserve("root.org.big", {"fpga": 41}),
        # a new user over the wildcard's copy
        lambda: engine.reserve("root.org.team", {"fpga": 6}, user="dan", groups=["dev"]),
        # a new application over the user's maxapplications (ann runs two already)
        lambda: engine.reserve("root.org", {"fpga": 1}, user="ann", groups=["dev"], application="a3"),
        # a new application over the shared group's maxapplications (three run in it)
        lambda: engine.reserve("root.org", {"memory": 1}, user="eve", groups=["z"], application="e1"),
    ]
    for attempt in attempts:
        with pytest.raises(QuotaLedgerError) as refused:
            attempt()
        found.append(type(refused.value))
    return found


def _fill(engine: QuotaEngine) -> None:
    for n in range(2):
        engine.commit(
            engine.reserve("root.org", {"fpga": 1}, user="ann", groups=["dev"], application=f"a{n}").id
        )
    engine.commit(engine.reserve("root.org", {"memory": 1}, user="gus", groups=["y"], application="g1").id)
    engine.commit(engine.reserve("root.org", {"memory": 1}, user="hal", groups=["y"], application="h1").id)
    engine.commit(engine.reserve("root.org", {"memory": 1}, user="ivy", groups=["y"], application="i1").id)


def test_first_uses_refuse_what_the_general_path_refuses_and_leave_nothing(
    postgres_url: URL, calls: Calls
) -> None:
    fast = configured(postgres_url)
    try:
        _fill(fast)
        assert calls.declined == []
        before = dump(fast)
        refused = _refusals(fast)
        after = dump(fast)
        fast.driver.functions = False
        general = _refusals(fast)
        assert dump(fast) == after
    finally:
        fast.close()
    assert refused == general == [OverQuota] * 4
    assert calls.declined == ["quota_ledger_reserve"] * 4
    assert after == before


def _race(threads: int, work: Callable[[int], None]) -> list[BaseException]:
    errors: list[BaseException] = []
    start = threading.Barrier(threads)

    def run(n: int) -> None:
        try:
            start.wait()
            work(n)
        except OverQuota:
            pass
        except BaseException as error:  # reported below
            errors.append(error)

    crew = [threading.Thread(target=run, args=(n,)) for n in range(threads)]
    for t in crew:
        t.start()
    for t in crew:
        t.join(timeout=120)
    return errors


@pytest.fixture
def racing(postgres_url: URL, calls: Calls) -> Iterator[tuple[QuotaEngine, Calls]]:
    engine = configured(postgres_url)
    yield engine, calls
    engine.close()


def _duplicates(url: URL) -> list[tuple[Any, ...]]:
    return rows(
        url,
        "SELECT 'usage', scope_type || scope || resource, count(*) FROM quota_usages"
        " GROUP BY scope_type, scope, resource HAVING count(*) > 1"
        " UNION ALL SELECT 'identity', kind || name || queue || resource, count(*) FROM quota_identity_usages"
        " GROUP BY kind, name, queue, resource HAVING count(*) > 1"
        " UNION ALL SELECT 'app', app_key, count(*) FROM quota_applications"
        " GROUP BY app_key HAVING count(*) > 1",
    )


@pytest.mark.parametrize("kind", ["queue", "application", "user", "group"])
def test_concurrent_first_uses_of_one_thing_stay_within_limits(
    racing: tuple[QuotaEngine, Calls], postgres_url: URL, kind: str
) -> None:
    engine, calls = racing
    requests: dict[str, Callable[[int], dict[str, Any]]] = {
        # 8 x 6 fpga on one new queue under root.org's 40
        "queue": lambda n: {"queue": "root.org.fresh", "resources": {"fpga": 6}},
        # one new application of one new user: 8 x 1 fpga under ann's 5 at root.org.team
        "application": lambda n: {
            "queue": "root.org.team",
            "resources": {"fpga": 1},
            "user": "ann",
            "groups": ["dev"],
            "application": "a1",
        },
        # one new user, each thread its own new application: ann's maxapplications is 2
        "user": lambda n: {
            "queue": "root.org",
            "resources": {"fpga": 1},
            "user": "ann",
            "groups": ["dev"],
            "application": f"a{n}",
        },
        # new users of new groups tracked against the shared wildcard group: 3 applications
        "group": lambda n: {
            "queue": "root.org",
            "resources": {"memory": "1Gi"},
            "user": f"u{n}",
            "groups": [f"new{n}"],
            "application": f"g{n}",
        },
    }

    def work(n: int) -> None:
        args = requests[kind](n)
        engine.commit(engine.reserve(args.pop("queue"), args.pop("resources"), **args).id)

    errors = _race(THREADS, work)
    assert errors == []
    assert engine.audit() == []
    assert _duplicates(postgres_url) == []
    committed = rows(postgres_url, "SELECT count(*) FROM reservations WHERE state = 'committed'")[0][0]
    expected = {"queue": 6, "application": 5, "user": 2, "group": 3}[kind]
    assert committed == expected
    assert calls.made.count("quota_ledger_reserve") >= THREADS  # more if a call was retried
    # only refusals reach the general path
    assert calls.declined.count("quota_ledger_reserve") == THREADS - expected
