"""A stopped database: every call retries within the driver's budget, then raises
DatabaseUnavailable (HTTP: 503 with Retry-After), also when a connection must first be opened."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import uvicorn
from pg_cluster import PgCluster

from quota_ledger import DatabaseUnavailable, QuotaEngine
from quota_ledger.cli import app as cli
from quota_ledger.http.app import create_app
from quota_ledger.runtime import overview, sweeper, tokens
from quota_ledger.runtime.settings import Settings

NAMESPACE = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"}}
QUOTA = {
    "apiVersion": "v1",
    "kind": "ResourceQuota",
    "metadata": {"name": "q", "namespace": "team"},
    "spec": {"hard": {"pods": "5"}},
}
POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "p", "namespace": "team", "uid": "u-1"},
    "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]},
}


#: the calls that group commit decides (``batching=True``); every other call is the same
BATCHED = (
    "reserve",
    "reserve with key",
    "reserve_pod",
    "commit",
    "partial commit",
    "rollback",
    "release_reservation",
)


@pytest.fixture(params=[False, True], ids=["per-call", "batching"])
def stopped(cluster: PgCluster, request: pytest.FixtureRequest) -> Iterator[tuple[QuotaEngine, str]]:
    """An engine that has worked against the database, with every pooled connection closed
    and the server stopped: the next call has to open a connection."""
    url = cluster.create_database(f"outage_{uuid.uuid4().hex[:8]}")
    engine = QuotaEngine.from_url(url, batching=request.param)
    engine.migrate()
    engine.set_limits("root.a", {"fpga": 10})
    engine.apply_namespace(NAMESPACE)
    engine.apply_resource_quota(QUOTA)
    pending = engine.reserve("root.a", {"fpga": 1}, key="k1")
    engine.driver.backoff_cap = 0.05  # the same number of attempts, waited for less
    engine.driver.engine.dispose()
    cluster.stop()
    try:
        yield engine, pending.id
    finally:
        cluster.start()
        engine.close()


def _calls(engine: QuotaEngine, rid: str) -> dict[str, Callable[[], Any]]:
    return {
        "reserve": lambda: engine.reserve("root.a", {"fpga": 1}),
        "reserve with key": lambda: engine.reserve("root.a", {"fpga": 1}, key="k2"),
        "reserve_pod": lambda: engine.reserve_pod(POD),
        "commit": lambda: engine.commit(rid),
        "partial commit": lambda: engine.commit(rid, {"fpga": 1}),
        "rollback": lambda: engine.rollback(rid),
        "release": lambda: engine.release("root.a", {"fpga": 1}),
        "release_reservation": lambda: engine.release_reservation(rid),
        "release_pod": lambda: engine.release_pod(POD),
        "get": lambda: engine.get(rid),
        "get_by_key": lambda: engine.get_by_key("k1"),
        "usage": lambda: engine.usage("root.a"),
        "limits": engine.limits,
        "set_limits": lambda: engine.set_limits("root.b", {"fpga": 1}),
        "apply_config": lambda: engine.apply_config({"partitions": [{"name": "default", "queues": []}]}),
        "config": engine.config,
        "config_version": engine.config_version,
        "apply_namespace": lambda: engine.apply_namespace(NAMESPACE),
        "namespace_queue": lambda: engine.namespace_queue("team"),
        "apply_resource_quota": lambda: engine.apply_resource_quota(QUOTA),
        "delete_resource_quota": lambda: engine.delete_resource_quota("team", "q"),
        "apply_admission_config": lambda: engine.apply_admission_config(
            {"apiVersion": "apiserver.config.k8s.io/v1", "kind": "AdmissionConfiguration", "plugins": []}
        ),
        "resource_quotas": engine.resource_quotas,
        "resource_quota_status": lambda: engine.resource_quota_status("team", "q"),
        "expire": engine.expire,
        "user_usage": lambda: engine.user_usage("alice"),
        "group_usage": lambda: engine.group_usage("devs"),
        "user_usages": engine.user_usages,
        "group_usages": engine.group_usages,
        "application_summary": lambda: engine.application_summary("app"),
        "audit": engine.audit,
        "audit one partition": lambda: engine.audit(partition="default"),
        "migrate": engine.migrate,
        "tokens.add": lambda: tokens.add(engine, "t", "reader"),
        "tokens.listing": lambda: tokens.listing(engine),
        "tokens.revoke": lambda: tokens.revoke(engine, "t"),
        "tokens.verify": lambda: tokens.verify(engine, "qlt_x"),
        "overview.pending_summary": lambda: overview.pending_summary(engine),
        "overview.soonest_expiring": lambda: overview.soonest_expiring(engine),
        "overview.queue_tree": lambda: overview.queue_tree(engine),
    }


def test_every_call_on_a_stopped_database_raises_database_unavailable(
    stopped: tuple[QuotaEngine, str],
) -> None:
    engine, rid = stopped
    wrong: dict[str, str] = {}
    for name, call in _calls(engine, rid).items():
        if engine.group_commit is not None and name not in BATCHED:
            continue
        before = sum(engine.driver.retries.values())
        try:
            call()
        except DatabaseUnavailable:
            retried = sum(engine.driver.retries.values()) - before
            # migrate is not retried (a half-done migration is not safe to repeat everywhere)
            if name != "migrate" and retried < engine.driver.max_attempts - 1:
                wrong[name] = f"DatabaseUnavailable after only {retried} retries"
        except Exception as error:
            wrong[name] = f"{type(error).__module__}.{type(error).__name__}: {error}"[:200]
        else:
            wrong[name] = "returned although the database is down"
    assert wrong == {}


def test_reserve_and_commit_retry_then_give_up_within_the_budget(
    stopped: tuple[QuotaEngine, str],
) -> None:
    engine, rid = stopped
    batches = engine.batch_stats
    engine.driver.backoff_cap = 0.5  # the default budget
    calls: list[Callable[[], Any]] = [
        lambda: engine.reserve("root.a", {"fpga": 1}),
        lambda: engine.commit(rid),
    ]
    for call in calls:
        started = time.monotonic()
        with pytest.raises(DatabaseUnavailable, match="gave up after 10 attempts"):
            call()
        assert 0.05 < time.monotonic() - started < 10
    assert engine.batch_stats == batches  # nothing was decided


@pytest.mark.parametrize("batching", [False, True], ids=["per-call", "batching"])
def test_a_call_during_a_short_outage_is_served_once_the_database_is_back(
    cluster: PgCluster, batching: bool
) -> None:
    url = cluster.create_database(f"outage_{uuid.uuid4().hex[:8]}")
    engine = QuotaEngine.from_url(url, batching=batching)
    engine.migrate()
    engine.set_limits("root.a", {"fpga": 10})
    engine.driver.backoff_base = 0.05  # a budget of about 4 s: long enough for a restart
    engine.driver.engine.dispose()
    cluster.stop()
    restarter = threading.Timer(0.3, cluster.start)
    restarter.start()
    try:
        made = engine.reserve("root.a", {"fpga": 2}, key="during")
        assert engine.commit(made.id).committed == {"fpga": 2}
        assert engine.driver.retries["disconnect"] > 0
        assert engine.usage("root.a")["fpga"].in_use == 2
        assert engine.batch_stats.requests == (2 if batching else 0)
    finally:
        restarter.join()
        engine.close()


def test_http_answers_503_with_retry_after_while_the_database_is_down(cluster: PgCluster) -> None:
    url = cluster.create_database(f"outage_{uuid.uuid4().hex[:8]}")
    engine = QuotaEngine.from_url(url)
    engine.migrate()
    engine.set_limits("root.a", {"fpga": 10})
    token = tokens.add(engine, "svc", "admin")
    settings = Settings(db="sqlite://", token_cache_seconds=600.0)  # type: ignore[call-arg]
    server = uvicorn.Server(
        uvicorn.Config(create_app(engine, settings, sweep=False), host="127.0.0.1", port=0, log_level="error")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline
        assert thread.is_alive()
        time.sleep(0.02)
    base = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    try:
        with httpx.Client(base_url=base, timeout=30, headers={"Authorization": f"Bearer {token}"}) as client:
            made = client.post("/v1/reservations", json={"queue": "root.a", "resources": {"fpga": 1}})
            assert made.status_code == 201  # the token is cached from here on
            engine.driver.backoff_cap = 0.05
            engine.driver.engine.dispose()
            cluster.stop()
            try:
                rid = made.json()["id"]
                requests = [
                    ("POST", "/v1/reservations", {"queue": "root.a", "resources": {"fpga": 1}, "key": "x"}),
                    ("POST", f"/v1/reservations/{rid}/commit", None),
                    ("POST", f"/v1/reservations/{rid}/rollback", None),
                    ("POST", f"/v1/reservations/{rid}/release", None),
                    ("GET", f"/v1/reservations/{rid}", None),
                    ("POST", "/v1/releases", {"queue": "root.a", "resources": {"fpga": 1}}),
                    ("GET", "/v1/queues/root.a/usage", None),
                    ("GET", "/v1/limits", None),
                    ("GET", "/v1/config", None),
                    ("POST", "/v1/audit", None),
                    ("GET", "/ws/v1/partition/default/usage/users", None),
                    ("GET", "/ws/v1/partition/default/usage/groups", None),
                ]
                seen = {}
                for method, path, body in requests:
                    answer = client.request(method, path, json=body)
                    seen[path if method == "GET" else f"{method} {path}"] = (
                        answer.status_code,
                        answer.headers.get("retry-after"),
                    )
                assert set(seen.values()) == {(503, "1")}, seen
                # A scrape still answers, without the figures it could not read.
                assert client.get("/metrics").status_code == 200
                ready = client.get("/readyz")
                assert (ready.status_code, ready.headers.get("retry-after")) == (503, "1")
            finally:
                cluster.start()
            assert client.get("/v1/queues/root.a/usage").status_code == 200
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        engine.close()


@pytest.mark.parametrize("stopped", [False], ids=["per-call"], indirect=True)
def test_cli_commands_on_a_stopped_database_exit_1_with_a_ledger_error(
    stopped: tuple[QuotaEngine, str], capsys: pytest.CaptureFixture[str]
) -> None:
    engine, rid = stopped
    url = engine.driver.url.render_as_string(hide_password=False)
    for argv in (["db", "current"], ["db", "upgrade"], ["usage", "root.a"], ["commit", rid], ["audit"]):
        assert cli.main(["--db", url, "--json", *argv]) == cli.EXIT_ERROR, argv
        # DatabaseUnreachable is the DatabaseUnavailable of a connection that cannot be opened
        assert '"error": "DatabaseUnreachable"' in capsys.readouterr().err, argv


def test_the_sweeper_outlives_a_missing_schema_and_an_outage(cluster: PgCluster) -> None:
    url = cluster.create_database(f"outage_{uuid.uuid4().hex[:8]}")
    engine = QuotaEngine.from_url(url)  # not migrated yet: every sweep fails with SchemaNotReady
    engine.driver.backoff_cap = 0.01
    stop = threading.Event()
    expired: list[int] = []
    thread = threading.Thread(
        target=sweeper.run,
        args=(engine,),
        kwargs={"interval": 0.05, "batch_size": 10, "stop": stop, "on_round": expired.append},
        daemon=True,
    )
    thread.start()
    try:
        time.sleep(0.3)
        assert thread.is_alive()
        engine.migrate()
        engine.set_limits("root.a", {"fpga": 10})
        engine.driver.engine.dispose()
        cluster.stop()
        time.sleep(0.3)
        cluster.start()
        assert thread.is_alive()
        engine.reserve("root.a", {"fpga": 1}, ttl=0.1)
        deadline = time.monotonic() + 30
        while sum(expired) < 1:
            assert time.monotonic() < deadline, "the sweeper stopped sweeping"
            time.sleep(0.05)
        assert engine.usage("root.a")["fpga"].reserved == 0
    finally:
        stop.set()
        thread.join(timeout=30)
        engine.close()
