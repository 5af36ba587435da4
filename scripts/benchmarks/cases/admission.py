"""The admission webhook: ``POST /v1/admission/pods`` through ``quota-ledger serve`` (uvicorn,
``--http-workers`` processes) from :data:`CLIENTS` concurrent keep-alive clients, each sending
AdmissionReview CREATEs of distinct pods for a fixed time: reviews/s and latency p50/p99. A full
run also takes :data:`FEWER_CLIENTS`, to show where more concurrent reviews stop paying.

Plain HTTP on loopback with an ``admission`` token: the API server would call over HTTPS, whose
handshake a keep-alive connection pays once. Pods go to :data:`NAMESPACES` namespaces with a
ResourceQuota each; one in :data:`REFUSED_EVERY` asks for more CPU than its quota allows and is
refused, the others are admitted and stay pending (no sweeper, a ttl longer than the run). The
ledger is checked afterwards: audit() clean, every admitted pod a pending reservation.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
import uuid
from typing import Any

from benchmarks.cases.http import RawHttp, percentile, service_process
from benchmarks.database import fresh_database
from benchmarks.harness import BenchError, log, median
from benchmarks.settings import Config
from quota_ledger import QuotaEngine

#: concurrent clients, as many API server requests in flight at once
CLIENTS = 50
#: the client counts a full run takes before :data:`CLIENTS`
FEWER_CLIENTS = (1, 5)
NAMESPACES = 10
#: one review in REFUSED_EVERY (every client's REFUSED_EVERY-th) is of a pod over its quota
REFUSED_EVERY = 10
#: the namespaces' quota: the refused pods ask for more CPU than it allows at all
QUOTA_CPU = "1000"
#: full runs: rounds (medians reported) and measured seconds of each
ROUNDS = 3
ROUND_SECONDS = 10.0


def review_template(namespace: str, cpu: str) -> str:
    """An AdmissionReview of a pod CREATE as the API server sends it, as JSON with ``@UID@``
    (the pod's and the request's uid) and ``@NAME@`` left to fill in."""
    requests = {"cpu": cpu, "memory": "64Mi"}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "@NAME@", "namespace": namespace, "uid": "@UID@", "labels": {"app": "bench"}},
        "spec": {
            "containers": [
                {
                    "name": "app",
                    "image": "registry.example/app:1",
                    "resources": {"requests": requests, "limits": requests},
                }
            ],
            "restartPolicy": "Always",
        },
    }
    kind = {"group": "", "version": "v1", "kind": "Pod"}
    resource = {"group": "", "version": "v1", "resource": "pods"}
    request = {
        "uid": "@UID@",
        "kind": kind,
        "resource": resource,
        "requestKind": kind,
        "requestResource": resource,
        "name": "@NAME@",
        "namespace": namespace,
        "operation": "CREATE",
        "userInfo": {"username": "bench", "uid": "u-1", "groups": ["dev", "system:authenticated"]},
        "object": pod,
        "oldObject": None,
        "dryRun": False,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
    }
    body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    return json.dumps(body, separators=(",", ":"))


def resource_quota(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "compute", "namespace": namespace},
        "spec": {"hard": {"pods": "1000000", "requests.cpu": QUOTA_CPU, "requests.memory": "1Pi"}},
    }


def reviews(base: str, token: str, clients: int, warmup: float, seconds: float, seed: int) -> dict[str, Any]:
    """Closed loop: ``clients`` clients on one asyncio event loop, each on its own keep-alive
    connection, one review after another; counts (warm-up included) and the measured window's
    latencies."""
    host, _, port = base.removeprefix("http://").partition(":")
    namespaces = [f"team{i:02d}" for i in range(NAMESPACES)]
    admitted = {ns: review_template(ns, "1m") for ns in namespaces}
    too_big = {ns: review_template(ns, str(2 * int(QUOTA_CPU))) for ns in namespaces}

    async def main() -> dict[str, Any]:
        counts = {"allowed": 0, "refused": 0, "refused_expected": 0}
        latencies: list[float] = []
        counting = False
        stop = False

        async def client(index: int) -> None:
            rng = random.Random(seed * 1000 + index)  # clients < 1000
            conn = RawHttp(host, int(port), token)
            sent = 0
            try:
                while not stop:
                    sent += 1
                    refused = (sent + index) % REFUSED_EVERY == 0  # the clients take turns
                    template = (too_big if refused else admitted)[rng.choice(namespaces)]
                    uid = str(uuid.UUID(int=rng.getrandbits(128), version=4))
                    body = template.replace("@UID@", uid).replace("@NAME@", f"p-{uid[:13]}")
                    started = time.perf_counter()
                    status, answer = await conn.post("/v1/admission/pods", body.encode())
                    spent = time.perf_counter() - started
                    if status != 200:
                        raise BenchError(f"admission review: {status} {answer[:200]!r}")
                    counts["allowed" if json.loads(answer)["response"]["allowed"] else "refused"] += 1
                    counts["refused_expected"] += refused
                    if counting:
                        latencies.append(spent)
            finally:
                conn.close()

        tasks = [asyncio.create_task(client(i)) for i in range(clients)]
        await asyncio.sleep(warmup)
        counting = True
        started = time.perf_counter()
        await asyncio.sleep(seconds)
        counting = False
        elapsed = time.perf_counter() - started
        stop = True
        await asyncio.gather(*tasks)
        ordered = sorted(latencies)
        return {
            **counts,
            "measured": len(ordered),
            "reviews_per_s": len(ordered) / elapsed,
            "p50_ms": 1000 * percentile(ordered, 0.5),
            "p99_ms": 1000 * percentile(ordered, 0.99),
        }

    return asyncio.run(main())


def run(cfg: Config) -> dict[str, Any]:
    """Rounds of each client count sending reviews to the service, then the ledger's checks."""
    counts = (CLIENTS,) if cfg.quick else (*FEWER_CLIENTS, CLIENTS)
    rounds = 1 if cfg.quick else max(ROUNDS, cfg.repeat)
    seconds = cfg.seconds if cfg.quick else max(ROUND_SECONDS, cfg.seconds)
    result: dict[str, Any] = {
        "clients": CLIENTS,
        "workers": cfg.http_workers,
        "namespaces": NAMESPACES,
        "seconds": seconds,
        "load_average": os.getloadavg()[0],
        "by_clients": {},
    }
    with fresh_database(cfg.server_url) as db_url:
        engine = QuotaEngine.from_url(db_url, pool_size=4)
        try:
            engine.migrate()
            for i in range(NAMESPACES):
                engine.apply_resource_quota(resource_quota(f"team{i:02d}"))
            from quota_ledger.runtime import overview, tokens

            token = tokens.add(engine, "bench-admission", "admission")
            # A ttl longer than any run, and no sweeper: every admitted pod is still pending at the end.
            with service_process(db_url, cfg.http_workers, admission_ttl="86400") as base:
                for clients in counts:
                    every = []
                    for round_ in range(rounds):
                        # Seeds of their own: a pod uid sent again is the same pod, admitted once.
                        seed = 100 * clients + round_
                        found = reviews(base, token, clients, cfg.warmup, seconds, seed)
                        every.append(found)
                        log(
                            f"admission: {clients} clients {found['reviews_per_s']:.1f} reviews/s, "
                            f"p50 {found['p50_ms']:.1f} ms, p99 {found['p99_ms']:.1f} ms "
                            f"({found['allowed']} allowed, {found['refused']} refused)"
                        )
                    medians = {
                        name: median(f[name] for f in every) for name in ("reviews_per_s", "p50_ms", "p99_ms")
                    }
                    result["by_clients"][str(clients)] = {**medians, "rounds": every}
            result["load_average_end"] = os.getloadavg()[0]
            result["audit"] = [str(d) for d in engine.audit()]
            result["pending"] = sum(count for _partition, count, _age in overview.pending_summary(engine))
        finally:
            engine.close()
    main = result["by_clients"][str(CLIENTS)]
    result.update({name: main[name] for name in ("reviews_per_s", "p50_ms", "p99_ms")})
    result["rounds"] = main["rounds"]
    every = [found for each in result["by_clients"].values() for found in each["rounds"]]
    for name in ("allowed", "refused", "refused_expected"):
        result[name] = sum(found[name] for found in every)
    problems = []
    if result["refused"] != result["refused_expected"]:
        sent = result["refused_expected"]
        problems.append(f"{result['refused']} reviews refused, {sent} pods over quota sent")
    if result["pending"] != result["allowed"]:
        problems.append(f"{result['allowed']} pods allowed, {result['pending']} pending reservations")
    result["problems"] = problems
    for problem in problems:
        log(f"admission: {problem}")
    return result


def section(result: dict[str, Any]) -> list[str]:
    """The report's table: for each client count, reviews/s and latency (medians of the rounds);
    then the counts of every round and the checks."""
    by_clients = result["by_clients"]
    rounds = len(result["rounds"])
    taken = f"median of {rounds} rounds" if rounds > 1 else "1 round"
    checks = "; ".join(result["problems"]) or (
        f"{result['allowed']} allowed = {result['pending']} pending reservations, "
        f"{result['refused']} refused = pods over quota sent"
    )
    audit = "clean" if not result["audit"] else f"{len(result['audit'])} DRIFTS"
    lines = [
        "",
        f"### admission webhook: `POST /v1/admission/pods` through uvicorn ({result['workers']} worker "
        f"processes), plain HTTP on loopback, {taken} of {result['seconds']:g} s "
        f"(load average {result['load_average']:.1f} at the start)",
        "",
        "| clients | reviews/s | p50 ms | p99 ms | every round, reviews/s |",
        "|--:|--:|--:|--:|---|",
    ]
    for clients, found in by_clients.items():
        every = ", ".join(format(each["reviews_per_s"], ".0f") for each in found["rounds"])
        rate, p50, p99 = found["reviews_per_s"], found["p50_ms"], found["p99_ms"]
        lines.append(f"| {clients} | {rate:.0f} | {p50:.1f} | {p99:.1f} | {every} |")
    lines += ["", f"audit() {audit}; {checks}."]
    return lines
