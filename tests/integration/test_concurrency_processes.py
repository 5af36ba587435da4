"""SQLite shared by several processes: together they never reserve beyond one tight limit, and
the counters equal what the tables' history says."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from concurrent_load import _assert_counters_match_history
from sqlalchemy import create_engine, func, select

from quota_ledger import QuotaEngine
from quota_ledger.driver.schema import reservations

# -- SQLite shared by processes -------------------------------------------------------------
_CHILD = textwrap.dedent(
    """
    import json, random, sys, time
    from quota_ledger import OverQuota, QuotaEngine

    url, attempts = sys.argv[1], int(sys.argv[2])
    engine = QuotaEngine.from_url(url)
    engine.usage("root")  # connect before the start signal
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        sys.exit(3)
    ids, refused = [], 0
    for n in range(attempts):
        time.sleep(random.uniform(0, 0.003))  # a client's think time, so the processes interleave
        try:
            r = engine.reserve(("root.team.a", "root.team.b")[n % 2], {"gpu": 2, "memory": 1})
        except OverQuota:
            refused += 1
            continue
        ids.append(r.id)
        if len(ids) % 2:
            engine.commit(r.id)  # still counts against the limit, now as in use
    print(json.dumps({"ids": ids, "refused": refused, "retries": dict(engine.driver.retries)}), flush=True)
    engine.close()
    """
)


def test_sqlite_processes_share_one_tight_limit(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    url = f"sqlite:///{path}"
    limit, amount, processes, attempts = 40, 2, 4, 25
    with QuotaEngine.from_url(url) as engine:
        engine.migrate()
        engine.set_limits("root.team", {"gpu": limit})
    assert processes * attempts * amount > limit  # demand exceeds the limit

    children = [
        subprocess.Popen(
            [sys.executable, "-c", _CHILD, url, str(attempts)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(processes)
    ]
    results: list[dict[str, Any]] = []
    try:
        for child in children:
            assert child.stdout is not None
            line = child.stdout.readline()
            assert line.strip() == "ready", (line, child.stderr.read() if child.stderr else "")
        for child in children:  # start together: all are connected and waiting
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        for child in children:
            out, err = child.communicate(timeout=60)
            assert child.returncode == 0, err
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()

    ids = [rid for r in results for rid in r["ids"]]
    per_process = [len(r["ids"]) for r in results]
    print(f"\n[sqlite] reservations per process: {per_process}, retries: {[r['retries'] for r in results]}")
    assert sum(1 for count in per_process if count) >= 2, f"the processes did not interleave: {per_process}"
    assert len(ids) == len(set(ids))
    assert len(ids) == limit // amount, (
        f"{len(ids)} reservations succeeded against room for {limit // amount}"
    )
    assert sum(r["refused"] for r in results) == processes * attempts - limit // amount

    with QuotaEngine.from_url(url) as engine:
        assert engine.audit() == []
        team = engine.usage("root.team")["gpu"]
        assert team.in_use + team.reserved == limit
        assert team.limit == limit
        assert team.in_use == amount * sum((len(r["ids"]) + 1) // 2 for r in results)
    raw = create_engine(url)
    try:
        with raw.connect() as conn:
            assert (
                conn.execute(select(func.count()).select_from(reservations)).scalar_one() == limit // amount
            )
            _assert_counters_match_history(conn, {})
    finally:
        raw.dispose()
