"""A soak of the webhook's decision and the reconciler together, with failures: pods admitted
(``admit_pod`` with the webhook's ttl) or created while the webhook was down, stored, bound,
ended and deleted at random, while watches are cut, events are lost and the history is compacted
(410 Gone). Afterwards the ledger's usage equals the live pods' requests exactly, nothing is
pending (the reservations of pods never stored, or stored and deleted within history lost to
410 Gone, are rolled back by a relist past the grace), and ``audit()`` is clean.

300 pods in CI; ``QUOTA_LEDGER_SOAK_PODS=2000`` (``scripts/soak-reconciler``) for the long form.
The figures are printed (``pytest -s``)."""

from __future__ import annotations

import os
import random
import time
import uuid
from typing import Any

from sqlalchemy.engine import URL

from quota_ledger import QuotaEngine, QuotaLedgerError, ReservationState
from quota_ledger.reconciler.relist import uid_of_key
from tests.kube.conftest import eventually, pod, reconciling
from tests.kube.fake_apiserver import FakeApiServer

PODS = int(os.environ.get("QUOTA_LEDGER_SOAK_PODS", "300"))
NAMESPACES = [f"team-{n}" for n in range(4)]
#: about how many pods exist at a time
LIVE = 60
#: the webhook's ttl (QUOTA_LEDGER_ADMISSION_TTL's default)
TTL = 120.0


def _milli(cpu: str) -> int:
    return int(cpu.removesuffix("m"))


def test_soak_the_ledger_agrees_with_the_cluster_after_random_failures(
    db_url: URL, api: FakeApiServer
) -> None:
    seed = int(os.environ.get("QUOTA_LEDGER_SOAK_SEED", "7"))
    rng = random.Random(seed)
    engine = QuotaEngine.from_url(db_url)
    for name in NAMESPACES:
        api.create("namespaces", {"metadata": {"name": name}})
        api.create(
            "resourcequotas",
            {
                "metadata": {"name": "compute", "namespace": name},
                "spec": {"hard": {"pods": "30", "requests.cpu": "10"}},
            },
        )
    counts = dict.fromkeys(
        ("admitted", "refused", "unadmitted", "never_stored", "lost", "dropped", "gone"), 0
    )
    live: dict[str, dict[str, Any]] = {}  # uid -> the pod as stored
    started = time.monotonic()
    try:
        with reconciling(api, engine, relist_every=2.0, watch_timeout=3.0, pending_grace=1.0) as running:
            eventually(lambda: len(engine.resource_quotas()) == len(NAMESPACES))
            for n in range(PODS):
                manifest = pod(
                    f"p{n}", cpu=f"{rng.choice((100, 250, 500, 750))}m", namespace=rng.choice(NAMESPACES)
                )
                manifest["metadata"]["uid"] = str(uuid.uuid4())
                if rng.random() < 0.1:
                    counts["unadmitted"] += 1  # the webhook could not answer: failurePolicy Ignore
                else:
                    try:
                        engine.admit_pod(manifest, user="sue", ttl=TTL)
                    except QuotaLedgerError:
                        counts["refused"] += 1
                        continue  # the API server refuses to create it
                    counts["admitted"] += 1
                    if rng.random() < 0.03:
                        counts["never_stored"] += 1  # a later webhook refused it
                        continue
                lost = rng.random() < 0.05
                counts["lost"] += lost
                stored = api.create("pods", manifest, deliver=not lost)
                live[stored["metadata"]["uid"]] = stored
                # what happens to the pods that exist: bound, ended, deleted
                # deletions outpace creations above LIVE pods, so the cluster neither fills up nor
                # empties and most pods pass the webhook
                delete_from = 0.45 if len(live) > LIVE else 0.8
                for uid in rng.sample(sorted(live), k=min(len(live), 2)):
                    current = live[uid]
                    meta = current["metadata"]
                    roll = rng.random()
                    lost = rng.random() < 0.05
                    counts["lost"] += lost
                    ended = (current.get("status") or {}).get("phase") in ("Succeeded", "Failed")
                    if ended and roll < delete_from:
                        continue  # an ended pod does not run again; it is deleted in time
                    if roll < 0.25 and "nodeName" not in current["spec"]:
                        current = {
                            **current,
                            "spec": {**current["spec"], "nodeName": "node-1"},
                            "status": {"phase": "Running"},
                        }
                        live[uid] = api.update("pods", current, deliver=not lost)
                    elif roll < 0.45 and not ended:
                        phase = rng.choice(("Succeeded", "Failed"))
                        live[uid] = api.update(
                            "pods", {**current, "status": {"phase": phase}}, deliver=not lost
                        )
                    elif roll >= delete_from:
                        api.delete("pods", meta["namespace"], meta["name"], deliver=not lost)
                        del live[uid]
                if rng.random() < 0.03:
                    api.drop_watches()
                    counts["dropped"] += 1
                if rng.random() < 0.01:
                    api.compact()
                    api.drop_watches()
                    counts["gone"] += 1
            relists = running.metric("quota_ledger_reconciler_relists_total", kind="pods", reason="periodic")
            # full relists after the last change: the third begins more than the grace after it
            eventually(
                lambda: (
                    running.metric("quota_ledger_reconciler_relists_total", kind="pods", reason="periodic")
                    >= relists + 3
                ),
                timeout=60,
            )
            metrics = {
                name: running.metric(f"quota_ledger_reconciler_{name}_total")
                for name in ("pods_committed", "pods_charged", "pods_released")
            }
            metrics["pending_rolled_back"] = running.metric(
                "quota_ledger_reconciler_pending_rolled_back_total"
            )
            metrics["overruns"] = sum(
                running.metric("quota_ledger_reconciler_overruns_total", limit=kind)
                for kind in ("quota", "queue")
            )
            metrics["relists"] = sum(
                running.metric("quota_ledger_reconciler_relists_total", kind="pods", reason=reason)
                for reason in ("start", "periodic", "gone", "recovery")
            )
            metrics["watch_restarts"] = sum(
                running.metric("quota_ledger_reconciler_watch_restarts_total", kind="pods", reason=reason)
                for reason in ("dropped", "timeout", "error", "api")
            )
        elapsed = time.monotonic() - started

        running_pods = [
            p for p in live.values() if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        ]
        held = engine.held_keys()
        pending = {
            uid_of_key(k): rid for k, (rid, state) in held.items() if state is ReservationState.PENDING
        }
        # pods never stored, or stored and deleted unseen (after 410 Gone): rolled back by a relist
        assert pending == {}
        charged = {uid_of_key(k) for k, (_, state) in held.items() if state is ReservationState.COMMITTED}
        assert charged == {p["metadata"]["uid"] for p in running_pods}
        for namespace in NAMESPACES:
            mine = [p for p in running_pods if p["metadata"]["namespace"] == namespace]
            usage = engine.usage(f"root.{namespace}")
            cpu = sum(_milli(p["spec"]["containers"][0]["resources"]["requests"]["cpu"]) for p in mine)
            assert usage["vcore"].in_use == cpu, namespace
            assert usage["pods"].in_use == len(mine), namespace
            assert usage["vcore"].reserved == 0, namespace
        assert engine.audit() == []
        print(
            f"\nsoak on {db_url.get_backend_name()}: {PODS} pods (seed {seed}) in {elapsed:.1f} s: {counts}; "
            f"running at the end {len(running_pods)}; "
            f"reconciler {metrics}"
        )
    finally:
        engine.close()
