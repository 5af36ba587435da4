"""The command line: every option of ``scripts/bench`` and the :class:`Config` a run reads."""

from __future__ import annotations

import argparse
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.engine import URL

from benchmarks.database import DEFAULT_URL, local_url

#: the repository, and the executable that re-runs itself as the sweeper's process
REPO = Path(__file__).resolve().parent.parent.parent
SCRIPT = REPO / "scripts" / "bench"

IMPLEMENTATIONS = ("library", "psycopg", "pgbench")
#: the cases, in the order a run takes them (``group-commit`` reads ``hot``'s PostgreSQL rounds),
#: and those a run takes when ``--cases`` does not say
CASES = (
    "throughput",
    "sweep",
    "hierarchy",
    "kube",
    "http",
    "admission",
    "cold",
    "hot",
    "group-commit",
    "set-limits",
    "cli",
    "waiting",
)
DEFAULT_CASES = ("throughput", "sweep", "hierarchy", "kube", "hot")
#: the cases that run pgbench (unless ``--only`` leaves it out)
PGBENCH_CASES = ("throughput", "hot")
#: backends of the first-use case, and its MariaDB server when no flag or variable names one
COLD_BACKENDS = ("postgresql", "mariadb", "sqlite")
DEFAULT_MARIADB_URL = "mysql://root@127.0.0.1:3306/test"
#: seconds of each baseline window around a sweep (at least; --seconds if longer): the ratio
#: compares windows, and a 5 s window of 16 threads moves by 10-15% from one to the next here
SWEEP_BASELINE_SECONDS = 10.0


@dataclass
class Config:
    """One run's settings, defaults filled in (``--quick`` changes several)."""

    server_url: URL
    seconds: float
    warmup: float
    repeat: int
    threads: list[int]
    scopes: int
    sweep_rows: int
    sweep_threads: int
    sweep_timeout: float
    sweep_workers: int
    sweep_batch: int
    sweep_max_rate: float | None
    sweep_baseline_seconds: float
    implementations: list[str]
    cases: list[str]
    http_workers: int
    cold_backends: list[str]
    cold_batching: bool
    mariadb_url: str
    hot_clients: list[int]
    hot_batch: int
    set_limits_sequence: int
    quick: bool
    json_path: Path | None
    pgbench: str | None

    @property
    def side_threads(self) -> int:
        """Threads of the side-by-side cases (hierarchy, pods, HTTP clients; the admission case
        has clients of its own)."""
        return 16 if not self.quick else 4

    def runs(self, case: str) -> bool:
        """Whether the run takes ``case`` (one of :data:`CASES`)."""
        assert case in CASES, case
        return case in self.cases


def select_cases(cases: str, skip: str, http: bool, cli: bool = False, admission: bool = False) -> list[str]:
    """The cases ``--cases``, ``--skip``, ``--http``, ``--cli`` and ``--admission`` select, in the
    order a run takes them; ``ValueError`` naming what is not a case."""

    def names(text: str) -> set[str]:
        return {part.strip() for part in text.split(",") if part.strip()}

    groups = {"default": DEFAULT_CASES, "all": CASES}
    chosen = {case for name in names(cases) for case in groups.get(name, (name,))}
    skipped = names(skip)
    unknown = sorted((chosen | skipped) - set(CASES))
    if unknown:
        raise ValueError(", ".join(unknown))
    if http:
        chosen.add("http")
    if cli:
        chosen.add("cli")
    if admission:
        chosen.add("admission")
    return [case for case in CASES if case in chosen - skipped]


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, Config | None]:
    """The arguments, and the run's Config (None in the sweeper's process)."""
    # No abbreviations: a case name is not a flag, and --cold is not taken for --cold-backends.
    parser = argparse.ArgumentParser(
        prog="scripts/bench",
        allow_abbrev=False,
        description="reserve+commit throughput of quota_ledger vs raw psycopg vs pgbench, the "
        "expiry sweep under load, and side-by-side cases, each on a fresh database created and "
        "dropped by the run.",
    )
    parser.add_argument(
        "--db",
        default=os.environ.get("QUOTA_LEDGER_BENCH_POSTGRES_URL", DEFAULT_URL),
        help="server URL; a database ql_bench_<random> is created next to the one named "
        "(default: $QUOTA_LEDGER_BENCH_POSTGRES_URL or %(default)s)",
    )
    parser.add_argument("--seconds", type=float, default=None, help="measured seconds per cell (default 5)")
    parser.add_argument("--warmup", type=float, default=None, help="warm-up seconds per cell (default 1)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per cell; medians are reported")
    parser.add_argument("--threads", default=None, help="comma-separated worker counts (default 1,4,16)")
    parser.add_argument("--scopes", type=int, default=None, help="spread-out scopes (default 10000)")
    parser.add_argument(
        "--sweep-rows", type=int, default=None, help="stale reservations to expire (default 100000)"
    )
    parser.add_argument(
        "--sweep-timeout",
        type=float,
        default=None,
        help="stop the sweep after this many seconds and report how far it got (default 45)",
    )
    parser.add_argument(
        "--sweep-workers", type=int, default=1, help="expire(workers=N) threads of the sweeper (default 1)"
    )
    parser.add_argument(
        "--sweep-batch", type=int, default=500, help="expire(batch_size=N) of the sweeper (default 500)"
    )
    parser.add_argument(
        "--sweep-max-rate",
        type=float,
        default=None,
        help="expire(max_rate=N) of the sweeper, reservations per second (default: no limit)",
    )
    parser.add_argument("--quick", action="store_true", help="a short smoke run (under a minute)")
    parser.add_argument("--only", default=",".join(IMPLEMENTATIONS), help="implementations to run")
    parser.add_argument(
        "--cases",
        default="default",
        help=f"comma-separated cases to run, of {','.join(CASES)}; 'default' stands for "
        f"{','.join(DEFAULT_CASES)} and 'all' for every case (default: %(default)s)",
    )
    parser.add_argument("--skip", default="", help="comma-separated cases to leave out of --cases")
    parser.add_argument("--http", action="store_true", help="add the http case to --cases")
    parser.add_argument(
        "--cli",
        action="store_true",
        help="add the cli case to --cases: the command's start-up (--cases cli: that alone, no server)",
    )
    parser.add_argument(
        "--admission",
        action="store_true",
        help="add the admission case to --cases: the admission webhook's reviews/s and latency",
    )
    parser.add_argument("--http-workers", type=int, default=2, help="service worker processes (default 2)")
    parser.add_argument(
        "--cold-batching", action="store_true", help="the cold case's engine runs with batching=True"
    )
    parser.add_argument(
        "--cold-backends",
        default=",".join(COLD_BACKENDS),
        help="backends of the cold case (default: %(default)s)",
    )
    parser.add_argument(
        "--mariadb",
        default=os.environ.get("QUOTA_LEDGER_BENCH_MARIADB_URL", DEFAULT_MARIADB_URL),
        help="MariaDB server of the cold and group-commit cases; a database ql_bench_<random> is "
        "created on it (default: $QUOTA_LEDGER_BENCH_MARIADB_URL or %(default)s)",
    )
    parser.add_argument(
        "--hot-clients",
        default="16,64",
        help="client counts of the hot and group-commit cases (default 16,64)",
    )
    parser.add_argument(
        "--hot-batch",
        type=int,
        default=20,
        help="operations per POST /v1/batch, hot case (default 20)",
    )
    parser.add_argument(
        "--set-limits-sequence",
        type=int,
        default=2000,
        help="consecutive set_limits calls timed at 100,000 queues after the rounds, set-limits "
        "case (default 2000)",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the results as JSON here")
    parser.add_argument("--sweep-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.sweep_worker:
        return args, None

    try:
        cases = select_cases(args.cases, args.skip, args.http, args.cli, args.admission)
    except ValueError as error:
        parser.error(f"--cases and --skip take names of {','.join(CASES)} (or default, all), not {error}")
    if not cases:
        parser.error("--cases and --skip leave no case to run")
    only = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = sorted(set(only) - set(IMPLEMENTATIONS))
    if unknown or not only:
        parser.error(f"--only takes a subset of {','.join(IMPLEMENTATIONS)}, not {args.only!r}")
    quick = bool(args.quick)
    threads_text = args.threads or ("1,4" if quick else "1,4,16")
    try:
        threads = sorted({int(t) for t in threads_text.split(",") if t.strip()})
    except ValueError:
        parser.error(f"--threads takes comma-separated integers, not {threads_text!r}")
    if not threads or threads[0] < 1 or threads[-1] > 64:
        parser.error("--threads must be between 1 and 64")
    seconds = args.seconds if args.seconds is not None else (1.5 if quick else 5.0)
    warmup = args.warmup if args.warmup is not None else (0.5 if quick else 1.0)
    scopes = args.scopes if args.scopes is not None else (1000 if quick else 10_000)
    sweep_rows = args.sweep_rows if args.sweep_rows is not None else (10_000 if quick else 100_000)
    if not 0 < seconds <= 120 or not 0 <= warmup <= 30:
        parser.error("--seconds must be in (0, 120] and --warmup in [0, 30]")
    if not 1 <= args.repeat <= 9:
        parser.error("--repeat must be between 1 and 9")
    if not 1 <= scopes <= 99_999 or not 1 <= sweep_rows <= 1_000_000:
        parser.error("--scopes must be in [1, 99999] and --sweep-rows in [1, 1000000]")
    if not 1 <= args.sweep_workers <= 16 or not 1 <= args.sweep_batch <= 100000:
        parser.error("--sweep-workers must be in [1, 16] and --sweep-batch in [1, 100000]")
    if args.sweep_max_rate is not None and not 0 < args.sweep_max_rate <= 10_000_000:
        parser.error("--sweep-max-rate must be in (0, 10000000]")
    cold_backends = [name.strip() for name in args.cold_backends.split(",") if name.strip()]
    if not cold_backends or set(cold_backends) - set(COLD_BACKENDS):
        parser.error(f"--cold-backends takes a subset of {','.join(COLD_BACKENDS)}")
    try:
        hot_clients = sorted({int(c) for c in args.hot_clients.split(",") if c.strip()})
    except ValueError:
        parser.error(f"--hot-clients takes comma-separated integers, not {args.hot_clients!r}")
    if not hot_clients or hot_clients[0] < 1 or hot_clients[-1] > 64:
        parser.error("--hot-clients must be between 1 and 64")
    if not 1 <= args.hot_batch <= 1000:
        parser.error("--hot-batch must be in [1, 1000]")
    pgbench = shutil.which("pgbench") or ("/usr/bin/pgbench" if Path("/usr/bin/pgbench").exists() else None)
    if "pgbench" in only and pgbench is None and set(cases) & set(PGBENCH_CASES):
        parser.error("pgbench is not installed: install it or pass --only library,psycopg")
    return args, Config(
        server_url=local_url(args.db),
        seconds=seconds,
        warmup=warmup,
        repeat=args.repeat,
        threads=threads,
        scopes=scopes,
        sweep_rows=sweep_rows,
        sweep_threads=4 if quick else 16,
        sweep_workers=args.sweep_workers,
        sweep_batch=args.sweep_batch,
        sweep_max_rate=args.sweep_max_rate,
        sweep_baseline_seconds=seconds if quick else max(seconds, SWEEP_BASELINE_SECONDS),
        sweep_timeout=args.sweep_timeout if args.sweep_timeout is not None else (30.0 if quick else 45.0),
        implementations=[name for name in IMPLEMENTATIONS if name in only],
        cases=cases,
        http_workers=args.http_workers,
        cold_backends=cold_backends,
        cold_batching=bool(args.cold_batching),
        mariadb_url=args.mariadb,
        hot_clients=hot_clients,
        hot_batch=args.hot_batch,
        set_limits_sequence=max(0, args.set_limits_sequence),
        quick=quick,
        json_path=args.json,
        pgbench=pgbench,
    )
