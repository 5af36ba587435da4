"""The pgbench implementation: the library's reserve and commit calls as a ``pgbench -M
prepared`` custom script, run as a child process and read back from its summary."""

from __future__ import annotations

import os
import re
import subprocess
from datetime import timedelta
from pathlib import Path

from sqlalchemy.engine import URL

from benchmarks.database import libpq_params
from benchmarks.harness import BenchError, Sample
from benchmarks.workload import AMOUNTS, HOT_QUEUE, KUBE_JSON, PARTITION, PG_LOCK_KEY, RESOURCES, TTL
from quota_ledger.driver.dialect import ADVISORY_NAMESPACE


def pgbench_script(pattern: str, scopes: int, version: int) -> str:
    """One pgbench transaction = the library's reserve call then its commit call.

    The same two function calls (``quota_ledger.driver.pg_functions``: the set functions, each
    for one request), each its own transaction; the reservation id is made by the server in the
    reserve statement and carried to the commit with ``\\gset``.
    """
    if pattern == "hot":
        pick, scope = "", f"'{HOT_QUEUE}'"
    else:
        pick, scope = f"\\set q random(0, {scopes - 1})\n", "'root.p' || lpad(:q::text, 5, '0')"
    res_array = "ARRAY[" + ", ".join(f"'{r}'" for r in RESOURCES) + "]::text[]"
    amounts = "ARRAY[" + ", ".join(str(AMOUNTS[r]) for r in RESOURCES) + "]::bigint[]"
    owners = "ARRAY[" + ", ".join("1" for _ in RESOURCES) + "]::integer[]"
    ttl_us = TTL // timedelta(microseconds=1)
    digest = "0" * 64
    nothing = "ARRAY[NULL]::text[]"
    return (
        f"{pick}"
        "SELECT g.rid, r.created_at FROM (SELECT gen_random_uuid()::text AS rid) AS g "
        f"CROSS JOIN LATERAL quota_ledger_reserve_many('{PARTITION}', {version}, "
        f"{ADVISORY_NAMESPACE}, {PG_LOCK_KEY}, ARRAY[g.rid], {nothing}, ARRAY['{digest}'], "
        f"ARRAY[{scope}], {nothing}, ARRAY[{ttl_us}]::bigint[], {nothing}, "
        # hex, because pgbench would read the JSON's colons as variables
        f"ARRAY[convert_from('\\x{KUBE_JSON.encode().hex()}'::bytea, 'UTF8')], "
        f"{nothing}, {nothing}, {nothing}, {nothing}, {owners}, {res_array}, {amounts}, "
        "ARRAY[]::integer[], ARRAY[]::text[], ARRAY[]::text[], ARRAY[]::text[], ARRAY[]::text[], "
        "ARRAY[]::bigint[], ARRAY[]::bigint[], "
        "ARRAY[]::integer[], ARRAY[]::text[], ARRAY[]::text[], ARRAY[]::bigint[]) AS r \\gset\n"
        "SELECT * FROM quota_ledger_commit_many(ARRAY[:rid::text], ARRAY[gen_random_uuid()::text], true);\n"
    )


_TPS = re.compile(r"tps = ([0-9.]+) \(without initial connection time\)")
_PROCESSED = re.compile(r"number of transactions actually processed: (\d+)")
_FAILED = re.compile(r"number of failed transactions: (\d+)")


def run_pgbench(pgbench: str, db_url: URL, script: Path, clients: int, seconds: int) -> Sample:
    """``clients`` pgbench clients on ``script`` for ``seconds`` whole seconds."""
    params = libpq_params(db_url)
    env = dict(os.environ)
    if "password" in params:
        env["PGPASSWORD"] = str(params["password"])
    command = [pgbench, "-n", "-M", "prepared", "-f", str(script), "-c", str(clients)]
    command += ["-j", str(min(clients, 2)), "-T", str(seconds)]
    for flag, key in (("-h", "host"), ("-p", "port"), ("-U", "user")):
        if key in params:
            command += [flag, str(params[key])]
    command.append(str(params["dbname"]))
    result = subprocess.run(  # noqa: PLW1510 - the exit code is checked below
        command, capture_output=True, text=True, timeout=seconds + 60, env=env
    )
    tps = _TPS.search(result.stdout)
    failed = _FAILED.search(result.stdout)
    if result.returncode != 0 or tps is None or (failed is not None and int(failed.group(1)) > 0):
        output = result.stdout[-2000:] + result.stderr[-2000:]
        raise BenchError(f"pgbench failed ({result.returncode}):\n{output}")
    processed = _PROCESSED.search(result.stdout)
    return Sample(
        pairs_per_s=float(tps.group(1)),
        pairs=int(processed.group(1)) if processed else 0,
        seconds=float(seconds),
    )
