"""The reconciler against a fake API server on loopback, driven by the official kubernetes
client: pods committed when stored, released when they end or vanish; missed events, 410 Gone
and dropped watches; pods the ledger never saw charged (over a limit too); namespaces and
ResourceQuotas mirrored, status written back; one leader of two, and a takeover."""

from __future__ import annotations

import threading
import uuid
from datetime import datetime
from typing import Any

from kubernetes import client

from quota_ledger import QuotaEngine, ReservationState
from quota_ledger.reconciler.listwatch import ListWatch
from quota_ledger.reconciler.metrics import Metrics
from tests.kube.conftest import eventually, pod, reconciling
from tests.kube.fake_apiserver import FakeApiServer


def _admitted(engine: QuotaEngine, manifest: dict[str, Any]) -> dict[str, Any]:
    """The pod as the webhook admitted it: with the uid the API server set before admission."""
    manifest["metadata"]["uid"] = str(uuid.uuid4())
    reservation = engine.admit_pod(manifest, user="sue", ttl=120)
    assert reservation.state is ReservationState.PENDING
    return manifest


def _state(engine: QuotaEngine, uid: str) -> tuple[ReservationState, bool]:
    found = engine.get_by_key(uid)
    return found.state, found.released_at is not None


def _in_use(engine: QuotaEngine, queue: str = "root.team") -> tuple[int, int]:
    found = engine.usage(queue).get("vcore")
    return (0, 0) if found is None else (found.in_use, found.reserved)


def test_pods_are_committed_when_stored_and_released_when_they_end_or_vanish(
    api: FakeApiServer, engine: QuotaEngine
) -> None:
    api.create("namespaces", {"metadata": {"name": "team"}})
    with reconciling(api, engine) as running:
        first = api.create("pods", _admitted(engine, pod("a")))
        second = api.create("pods", _admitted(engine, pod("b")))
        uid_a, uid_b = first["metadata"]["uid"], second["metadata"]["uid"]
        eventually(lambda: _in_use(engine) == (1000, 0))
        assert _state(engine, uid_a) == (ReservationState.COMMITTED, False)
        # bound to a node: nothing changes (it counted from creation)
        api.update("pods", {**first, "spec": {**first["spec"], "nodeName": "node-1"}})
        api.update("pods", {**second, "status": {"phase": "Running"}})
        api.update("pods", {**api.get("pods", "team", "a"), "status": {"phase": "Succeeded"}})
        eventually(lambda: _in_use(engine) == (500, 0))
        assert _state(engine, uid_a) == (ReservationState.COMMITTED, True)
        api.delete("pods", "team", "a")
        api.delete("pods", "team", "b")
        eventually(lambda: _in_use(engine) == (0, 0))
        assert _state(engine, uid_b) == (ReservationState.COMMITTED, True)
        assert running.metric("quota_ledger_reconciler_pods_committed_total") == 2
        assert running.metric("quota_ledger_reconciler_pods_released_total") == 2
        assert running.metric("quota_ledger_reconciler_pods_charged_total") == 0
    assert engine.audit() == []


def test_a_missed_deletion_is_caught_by_the_periodic_relist(api: FakeApiServer, engine: QuotaEngine) -> None:
    with reconciling(api, engine, relist_every=1.5) as running:
        api.create("pods", _admitted(engine, pod("a")))
        eventually(lambda: _in_use(engine) == (500, 0))
        api.delete("pods", "team", "a", deliver=False)  # the watch never hears of it
        eventually(lambda: _in_use(engine) == (0, 0))
        assert running.metric("quota_ledger_reconciler_relists_total", kind="pods", reason="periodic") >= 1
        assert running.metric("quota_ledger_reconciler_pods_released_total") == 1
    assert engine.audit() == []


def test_a_pod_the_ledger_never_saw_is_charged_even_over_a_limit(
    api: FakeApiServer, engine: QuotaEngine
) -> None:
    api.create(
        "resourcequotas",
        {
            "metadata": {"name": "compute", "namespace": "team"},
            "spec": {"hard": {"pods": "1", "requests.cpu": "1"}},
        },
    )
    with reconciling(api, engine) as running:
        eventually(lambda: engine.resource_quotas() == [("team", "compute")])
        api.create("pods", _admitted(engine, pod("a", cpu="600m")))
        eventually(lambda: _in_use(engine) == (600, 0))
        # created while the webhook could not answer (failurePolicy: Ignore): the ledger never saw it
        api.create("pods", pod("b", cpu="600m"))
        eventually(lambda: _in_use(engine) == (1200, 0))
        status = engine.resource_quota_status("team", "compute")
        assert status["used"] == {"pods": "2", "requests.cpu": "1200m"}
        assert running.metric("quota_ledger_reconciler_pods_charged_total") == 1
        assert running.metric("quota_ledger_reconciler_pods_committed_total") == 1
        assert running.metric("quota_ledger_reconciler_overruns_total", limit="quota") == 2  # pods, cpu
    assert engine.audit() == []


def test_410_gone_is_followed_by_a_relist(api: FakeApiServer, engine: QuotaEngine) -> None:
    with reconciling(api, engine) as running:
        eventually(
            lambda: running.metric("quota_ledger_reconciler_relists_total", kind="pods", reason="start")
        )
        api.create("pods", pod("a"), deliver=False)
        api.compact()
        api.drop_watches()  # they resume from a version the server no longer keeps
        eventually(lambda: _in_use(engine) == (500, 0))
        assert running.metric("quota_ledger_reconciler_relists_total", kind="pods", reason="gone") >= 1
    assert engine.audit() == []


def test_a_dropped_watch_resumes_from_its_last_version(api: FakeApiServer, engine: QuotaEngine) -> None:
    with reconciling(api, engine) as running:
        eventually(
            lambda: running.metric("quota_ledger_reconciler_relists_total", kind="pods", reason="start")
        )
        api.create("pods", pod("a"))
        eventually(lambda: _in_use(engine) == (500, 0))
        for name in ("b", "c"):
            api.drop_watches()
            api.create("pods", pod(name))
        eventually(lambda: _in_use(engine) == (1500, 0))
        assert (
            running.metric("quota_ledger_reconciler_watch_restarts_total", kind="pods", reason="dropped") >= 1
        )
        relists = sum(
            running.metric("quota_ledger_reconciler_relists_total", kind="pods", reason=reason)
            for reason in ("gone", "recovery", "periodic")
        )
        assert relists == 0
    assert engine.audit() == []


def test_bookmarks_keep_a_quiet_watch_current(api: FakeApiServer, engine: QuotaEngine) -> None:
    with reconciling(api, engine) as running:
        eventually(lambda: running.reconciler.loops)
        loop = next(each for each in running.reconciler.loops if each.kind == "pods")
        eventually(loop.synced.is_set)
        api.create("namespaces", {"metadata": {"name": "elsewhere"}})  # no pod event follows
        eventually(lambda: loop.resource_version == str(api.rv))
        assert any("allowWatchBookmarks=true" in r and "/api/v1/pods" in r for r in api.requests)


def test_namespaces_and_resourcequotas_are_mirrored(api: FakeApiServer, engine: QuotaEngine) -> None:
    engine.apply_resource_quota(
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "stale", "namespace": "old"},
            "spec": {"hard": {"pods": "1"}},
        }
    )
    annotations = {
        "yunikorn.apache.org/parentqueue": "root.analytics",
        "yunikorn.apache.org/namespace.quota": '{"cpu": "4", "memory": "8Gi"}',
    }
    api.create("namespaces", {"metadata": {"name": "spark", "annotations": annotations}})
    quota = api.create(
        "resourcequotas",
        {"metadata": {"name": "compute", "namespace": "spark"}, "spec": {"hard": {"pods": "5"}}},
    )
    with reconciling(api, engine):
        eventually(lambda: engine.resource_quotas() == [("spark", "compute")])  # the stale one deleted
        assert engine.namespace_queue("spark") == "root.analytics.spark"
        assert engine.usage("root.analytics.spark")["vcore"].limit == 4000
        api.update("resourcequotas", {**quota, "spec": {"hard": {"pods": "7"}}})
        eventually(lambda: engine.resource_quota_status("spark", "compute")["hard"] == {"pods": "7"})
        api.create("pods", pod("p", namespace="spark"))
        eventually(lambda: _in_use(engine, "root.analytics.spark") == (500, 0))
        api.delete("resourcequotas", "spark", "compute")
        eventually(lambda: engine.resource_quotas() == [])
    assert engine.audit() == []


def test_write_status_writes_the_ledgers_used_into_the_quota(api: FakeApiServer, engine: QuotaEngine) -> None:
    api.create(
        "resourcequotas",
        {
            "metadata": {"name": "compute", "namespace": "team"},
            "spec": {"hard": {"pods": "5", "requests.cpu": "2"}},
        },
    )
    with reconciling(api, engine, write_status=True, status_every=0.2) as running:
        api.create("pods", pod("a"))
        api.create("pods", pod("b", cpu="250m"))

        def shown() -> Any:
            return (api.get("resourcequotas", "team", "compute") or {}).get("status", {}).get("used")

        eventually(lambda: shown() == {"pods": "2", "requests.cpu": "750m"})
        assert api.get("resourcequotas", "team", "compute")["status"]["hard"] == {
            "pods": "5",
            "requests.cpu": "2",
        }
        assert running.metric("quota_ledger_reconciler_status_writes_total") >= 1


def test_without_write_status_nothing_is_written_to_the_api(api: FakeApiServer, engine: QuotaEngine) -> None:
    api.create(
        "resourcequotas",
        {"metadata": {"name": "compute", "namespace": "team"}, "spec": {"hard": {"pods": "5"}}},
    )
    with reconciling(api, engine):
        api.create("pods", pod("a"))
        eventually(lambda: _in_use(engine) == (500, 0))
    assert not [r for r in api.requests if not r.startswith("GET ")]


def test_of_two_reconcilers_one_leads_and_the_other_takes_over(
    api: FakeApiServer, engine: QuotaEngine
) -> None:
    with reconciling(api, engine, identity="one") as one, reconciling(api, engine, identity="two") as two:
        both = (one, two)
        eventually(lambda: any(r.reconciler.elector.leading.is_set() for r in both))
        leader = next(r for r in both if r.reconciler.elector.leading.is_set())
        other = two if leader is one else one
        api.create("pods", pod("a"))
        eventually(lambda: _in_use(engine) == (500, 0))
        assert not other.reconciler.elector.leading.is_set()
        assert leader.metric("quota_ledger_reconciler_leader") == 1
        assert other.metric("quota_ledger_reconciler_relists_total", kind="pods", reason="start") == 0

        # the leader stops renewing (its API calls fail): it stops acting, the other takes over
        def unreachable() -> bool:
            raise ConnectionError("the API server is unreachable")

        leader.reconciler.elector.try_acquire_or_renew = unreachable
        eventually(other.reconciler.elector.leading.is_set)
        eventually(lambda: not leader.reconciler.elector.leading.is_set())
        api.create("pods", pod("b"))
        eventually(lambda: _in_use(engine) == (1000, 0))
        assert other.metric("quota_ledger_reconciler_pods_charged_total") >= 1
        lease = api.get("leases", "quota-ledger", "quota-ledger-reconciler")
        assert lease is not None
        assert lease["spec"]["holderIdentity"] == ("two" if other is two else "one")
        assert lease["spec"]["leaseTransitions"] >= 1
    assert engine.audit() == []


def test_objects_the_ledger_refuses_are_counted_and_skipped(api: FakeApiServer, engine: QuotaEngine) -> None:
    api.create(
        "namespaces",
        {"metadata": {"name": "bad", "annotations": {"yunikorn.apache.org/namespace.quota": "{not json"}}},
    )
    api.create(
        "resourcequotas",
        {"metadata": {"name": "disk", "namespace": "team"}, "spec": {"hard": {"storage": "1"}}},
    )
    api.create(
        "resourcequotas",
        {"metadata": {"name": "compute", "namespace": "team"}, "spec": {"hard": {"pods": "5"}}},
    )
    with reconciling(api, engine) as running:
        api.create("pods", pod("a"))
        eventually(lambda: _in_use(engine) == (500, 0))
        assert engine.resource_quotas() == [("team", "compute")]
        assert running.metric("quota_ledger_reconciler_errors_total", kind="namespace") == 1
        assert running.metric("quota_ledger_reconciler_errors_total", kind="resourcequota") == 1
        assert (
            running.metric("quota_ledger_reconciler_relists_total", kind="namespaces", reason="recovery") == 0
        )


def test_a_list_is_read_in_pages_and_the_watch_starts_from_its_version(api: FakeApiServer) -> None:
    for n in range(5):
        api.create("pods", pod(f"p{n}"))
    seen: dict[str, list[Any]] = {"lists": [], "events": []}

    class Recorder:
        def relisted(self, items: list[dict[str, Any]], listed_at: datetime) -> None:
            seen["lists"].append(sorted(i["metadata"]["name"] for i in items))

        def event(self, kind: str, obj: dict[str, Any]) -> None:
            seen["events"].append((kind, obj["metadata"]["name"]))

    core = client.CoreV1Api(client.ApiClient(client.Configuration(host=api.url)))
    loop = ListWatch(
        "pods", core.list_pod_for_all_namespaces, Recorder(), Metrics(), relist_every=60, page_size=2
    )
    stop = threading.Event()
    thread = threading.Thread(target=loop.run, args=(stop,), daemon=True)
    thread.start()
    try:
        eventually(loop.synced.is_set)
        api.create("pods", pod("p5"))
        eventually(lambda: seen["events"] == [("ADDED", "p5")])
    finally:
        stop.set()
        loop.interrupt()
        thread.join(10)
    assert seen["lists"] == [[f"p{n}" for n in range(5)]]
    assert sum("continue=" in r for r in api.requests) == 2  # three pages of two


def test_a_relist_rolls_back_a_pending_reservation_whose_pod_never_came(
    api: FakeApiServer, engine: QuotaEngine
) -> None:
    never = _admitted(engine, pod("never-stored"))  # a later webhook refused it
    with reconciling(api, engine, relist_every=1.0, pending_grace=0.5) as running:
        stored = api.create("pods", _admitted(engine, pod("stored")))
        eventually(lambda: _state(engine, never["metadata"]["uid"]) == (ReservationState.ROLLED_BACK, False))
        assert _state(engine, stored["metadata"]["uid"]) == (ReservationState.COMMITTED, False)
        assert running.metric("quota_ledger_reconciler_pending_rolled_back_total") == 1
        assert _in_use(engine) == (500, 0)
    assert engine.audit() == []
