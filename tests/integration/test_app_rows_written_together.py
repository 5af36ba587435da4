"""Application rows written together (MariaDB, SQLite): ``update_apps`` writes every field of
every row it is given, in slices of one statement each, and no other row."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta

from sqlalchemy.engine import URL

from quota_ledger import QuotaEngine
from quota_ledger.driver.apps import ADD_SLICE
from quota_ledger.driver.tx import LedgerTx
from quota_ledger.model.tracking import AppState

PARTITION = "default"


def read(engine: QuotaEngine) -> dict[str, AppState]:
    apps = engine.driver.run(lambda tx: tx.read_apps(PARTITION))
    return {app.app_key: app for app in apps}


def test_update_apps_writes_each_row_whole_across_slices(core_db_url: URL) -> None:
    count = ADD_SLICE + 9  # two statements
    with QuotaEngine.from_url(core_db_url) as engine:
        engine.set_limits("root", {"fpga": 1000})
        for n in range(count + 1):
            engine.reserve("root.team", {"fpga": 1}, user=f"u{n}", groups=["dev"], application=f"a{n}")
        before = read(engine)
        keys = sorted(before)
        written, untouched = keys[:count], keys[count]
        when = datetime(2030, 1, 2, 3, 4, 5)

        def changed(n: int, app: AppState) -> AppState:
            return dataclasses.replace(
                app,
                user=f"v{n}",
                queue=f"root.q{n}",
                group=None if n % 3 == 0 else f"g{n}",
                state="finished" if n % 2 else "running",
                pending=n,
                usage={"fpga": [n, 2 * n]},
                area={"fpga": n * 1000},
                submitted_at=when - timedelta(seconds=n),
                started_at=None if n % 4 == 0 else when + timedelta(seconds=n),
                finished_at=when + timedelta(minutes=n) if n % 2 else None,
                changed_at=when + timedelta(hours=n),
            )

        wanted = {key: changed(n, before[key]) for n, key in enumerate(written)}

        def write(tx: LedgerTx) -> None:
            tx.lock_apps(PARTITION, written)
            tx.update_apps(wanted[key] for key in reversed(written))

        engine.driver.run(write)
        after = read(engine)
    assert {key: after[key] for key in written} == wanted
    assert after[untouched] == before[untouched]
