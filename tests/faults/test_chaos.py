"""Fault injection, short form: random traffic from 16 threads on a PostgreSQL of the tests'
own while backends are terminated every 100-300 ms, the database is restarted (immediate) and
its postmaster killed, and the HTTP service is killed; through the library, the library with
``batching=True`` and the service (whose batching is on); then every invariant (see chaos_run).
``scripts/chaos`` runs the same for longer."""

from __future__ import annotations

from chaos_run import Fault, Phase, run
from pg_cluster import PgCluster

PHASES = [
    Phase("library", "library", 16, (Fault(5, "restart"), Fault(10, "kill_postmaster"))),
    Phase("batching", "batching", 12, (Fault(4, "kill_postmaster"), Fault(8, "restart"))),
    Phase("http", "http", 14, (Fault(4, "kill_service"), Fault(9, "restart"))),
]


def test_faults_leave_every_invariant_intact_and_every_error_typed(cluster: PgCluster) -> None:
    report = run(cluster, PHASES, threads=16)
    print("\n" + report.table())
    assert report.failures() == []
    stats = report.stats
    assert stats.untyped == []
    assert stats.http_500s == 0
    assert report.violations() == 0
    # The run did what it is meant to: every kind of operation, refusals, faults that bit.
    for op in ("reserve", "commit", "rollback", "release", "sweep"):
        assert stats.served[op] > 0, stats.served
    assert stats.errors["OverQuota"] > 0, stats.errors
    assert stats.errors["HTTP 409 over_quota"] > 0, stats.errors
    assert report.terminated > 0
    assert report.batches.largest > 1, report.batches  # the batching phase decided calls together
    assert report.samples > 100
    assert [f.kind for f in report.faults] == [
        "restart",
        "kill_postmaster",
        "kill_postmaster",
        "restart",
        "kill_service",
        "restart",
    ]
    assert all(f.recovery is not None and f.recovery < 60 for f in report.faults), report.faults
