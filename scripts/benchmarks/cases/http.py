"""The HTTP service: reserve+commit through ``quota-ledger serve`` from keep-alive clients, side
by side with the library in process (target: >= 0.5x), and the latency of a paced 100
requests/s load (target: p99 < 50 ms)."""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy.engine import URL

from benchmarks.database import conninfo, fresh_database, vacuum
from benchmarks.harness import BenchError, log, median_ratio, run_threads, side_by_side
from benchmarks.settings import Config
from benchmarks.workload import REQUEST, LibraryWorker, QueuePicker, queue_picker, setup_engine
from quota_ledger import QuotaEngine

TARGET_HTTP = 0.5
TARGET_P99_MS = 50.0


def paced_latencies(base: str, token: str, pick: QueuePicker, rate: float, seconds: float) -> list[float]:
    """Open loop on one asyncio event loop: start one request every 1/rate seconds (a reserve,
    then its commit) and return every request's latency in seconds. One loop, not a thread
    pool, so the client itself does not queue requests up."""
    import httpx

    async def main() -> list[float]:
        rng = random.Random(99)
        latencies: list[float] = []
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
        async with httpx.AsyncClient(
            base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=30, limits=limits
        ) as client:

            async def timed(method: str, path: str, body: Any = None) -> Any:
                started = time.perf_counter()
                response = await client.request(method, path, json=body)
                latencies.append(time.perf_counter() - started)
                return response

            async def pair() -> None:
                made = await timed("POST", "/v1/reservations", {"queue": pick(rng), "resources": REQUEST})
                await asyncio.sleep(1 / rate * rng.random())
                await timed("POST", f"/v1/reservations/{made.json()['id']}/commit")

            tasks = []
            start = time.perf_counter()
            for i in range(int(rate * seconds / 2)):
                delay = start + 2 * i / rate - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(pair()))
            await asyncio.gather(*tasks)
        return latencies

    return asyncio.run(main())


def percentile(ordered: list[float], fraction: float) -> float:
    """The value at ``fraction`` (0.5: the median) of sorted values."""
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


class RawHttp:
    """A minimal HTTP/1.1 keep-alive client on asyncio streams: the load generator should cost
    the machine little next to the server it measures (httpx used most of a core here)."""

    def __init__(self, host: str, port: int, token: str) -> None:
        self.host, self.port = host, port
        self.auth = f"Authorization: Bearer {token}\r\n".encode()
        self.reader: Any = None
        self.writer: Any = None

    async def post(self, path: str, body: bytes = b"") -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n"
        ).encode()
        self.writer.write(head + self.auth + b"\r\n" + body)
        status_line = await self.reader.readline()
        length = 0
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        payload = await self.reader.readexactly(length) if length else b""
        return int(status_line.split()[1]), payload

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def http_pairs(
    base: str, token: str, pick: QueuePicker, clients: int, warmup: float, seconds: float
) -> float:
    """Closed loop: ``clients`` concurrent reserve+commit loops, each on its own keep-alive
    connection, all on one asyncio event loop."""
    where = urlsplit(base)
    request = json.dumps({"resources": REQUEST}, separators=(",", ":"))[1:]

    async def main() -> float:
        count = 0
        counting = False
        stop = False

        async def loop(seed: int) -> None:
            nonlocal count
            rng = random.Random(seed)
            conn = RawHttp(where.hostname or "127.0.0.1", where.port or 80, token)
            try:
                while not stop:
                    body = f'{{"queue":"{pick(rng)}",{request}'.encode()
                    status, made = await conn.post("/v1/reservations", body)
                    if status != 201:
                        raise BenchError(f"http reserve: {status} {made[:200]!r}")
                    rid = json.loads(made)["id"]
                    status, done = await conn.post(f"/v1/reservations/{rid}/commit")
                    if status != 200:
                        raise BenchError(f"http commit: {status} {done[:200]!r}")
                    if counting:
                        count += 1
            finally:
                conn.close()

        tasks = [asyncio.create_task(loop(i)) for i in range(clients)]
        await asyncio.sleep(warmup)
        counting = True
        started = time.perf_counter()
        await asyncio.sleep(seconds)
        counting = False
        elapsed = time.perf_counter() - started
        stop = True
        await asyncio.gather(*tasks)
        return count / elapsed

    return asyncio.run(main())


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def service_process(db_url: URL, workers: int, **settings: str) -> Iterator[str]:
    """``quota-ledger serve`` on a free port with ``workers`` processes, no migration and no
    sweeper, ``QUOTA_LEDGER_<NAME>`` set from ``settings``; yields its base URL once it answers."""
    env = dict(os.environ, QUOTA_LEDGER_DB=db_url.render_as_string(hide_password=False))
    env.update({f"QUOTA_LEDGER_{name.upper()}": value for name, value in settings.items()})
    command = [sys.executable, "-m", "quota_ledger.cli", "serve", "--port", str(free_port())]
    command += ["--no-migrate", "--no-sweep", "--workers", str(workers)]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        if not line.startswith("quota-ledger serving on "):
            raise BenchError(f"the service did not start: {line!r}")
        base = line.split()[3]
        import httpx

        for _ in range(300):  # the announcement comes once a worker answers; all of them, soon
            try:
                httpx.get(f"{base}/healthz", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        yield base
    finally:
        server.terminate()
        server.wait(timeout=30)


def run(cfg: Config) -> dict[str, Any]:
    """Reserve+commit through the HTTP service vs the library in process, side by side, and the
    latency of a paced 100 requests/s load."""
    threads = cfg.side_threads
    scopes = min(cfg.scopes, 1000)
    result: dict[str, Any] = {"threads": threads, "workers": cfg.http_workers, "library": [], "http": []}
    with fresh_database(cfg.server_url) as db_url:
        engine = QuotaEngine.from_url(db_url, pool_size=threads + 2)
        stack = ExitStack()
        try:
            setup_engine(engine, scopes)
            from quota_ledger.runtime import tokens

            token = tokens.add(engine, "bench", "service")
            base = stack.enter_context(service_process(db_url, cfg.http_workers))
            pick = queue_picker("spread", scopes)
            rounds = side_by_side(
                cfg.repeat,
                lambda: vacuum(conninfo(db_url)),
                lambda round_: (
                    run_threads(
                        [LibraryWorker(engine, pick, 31 * round_ + i) for i in range(threads)],
                        cfg.warmup,
                        cfg.seconds,
                    ).pairs_per_s
                ),
                lambda _round: http_pairs(base, token, pick, threads, cfg.warmup, cfg.seconds),
            )
            for library, http in rounds:
                result["library"].append(library)
                result["http"].append(http)
                log(f"threads={threads} library {library:.1f}, http {http:.1f} pairs/s")
            latencies = sorted(paced_latencies(base, token, pick, 100.0, max(5.0, cfg.seconds)))
            result["paced_requests"] = len(latencies)
            result["p50_ms"] = 1000 * percentile(latencies, 0.5)
            result["p99_ms"] = 1000 * percentile(latencies, 0.99)
            log(f"100 requests/s: p50 {result['p50_ms']:.1f} ms, p99 {result['p99_ms']:.1f} ms")
            result["audit"] = [str(d) for d in engine.audit()]
        finally:
            stack.close()
            engine.close()
    result["ratio"] = median_ratio(result["http"], result["library"])
    return result
