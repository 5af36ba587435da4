"""``quota-ledger reservations`` lists by filters, as a table or JSON; ``quota-ledger prune``
lists the counters at zero that nothing references and deletes them with ``--apply``."""

from __future__ import annotations

import json

from sqlalchemy.engine import URL
from test_cli import cli, ok


def test_reservations_are_listed_by_filters(db_url: URL) -> None:
    sue = json.loads(ok(cli("reserve", "root.dev.a", "vcore=1", "--user", "sue", "--json", db=db_url)))
    ok(cli("reserve", "root.prod", "memory=1Gi", "--user", "bob", db=db_url))
    table = ok(cli("reservations", "--queue", "root.dev", db=db_url))
    assert table.splitlines()[0].split() == [
        "ID",
        "STATE",
        "QUEUE",
        "USER",
        "APPLICATION",
        "CREATED",
        "RESOURCES",
    ]
    assert sue["id"] in table
    assert "root.prod" not in table
    listed = json.loads(ok(cli("reservations", "--user", "bob", "--state", "pending", "--json", db=db_url)))
    assert [r["queue"] for r in listed["reservations"]] == ["root.prod"]
    assert listed["reservations"][0]["resources"] == {"memory": 2**30}
    assert listed["more"] is False
    first = ok(cli("reservations", "--limit", "1", db=db_url))
    assert "more match" in first
    assert ok(cli("reservations", "--older-than", "1h", db=db_url)) == "no reservations match\n"
    bad = cli("reservations", "--older-than", "soon", db=db_url)
    assert bad.returncode == 2
    assert "90s, 10m, 2h" in bad.stderr


def test_prune_is_a_dry_run_until_applied(db_url: URL) -> None:
    made = json.loads(ok(cli("reserve", "root.tmp", "gpus=1", "--json", db=db_url)))
    ok(cli("rollback", made["id"], db=db_url))
    dry = ok(cli("prune", db=db_url))
    assert "root.tmp" in dry
    assert "would prune 1 counter (a dry run: --apply deletes them)" in dry
    assert "pruned 1 counter" in ok(cli("prune", "--apply", db=db_url))
    assert json.loads(ok(cli("prune", "--json", db=db_url))) == {"applied": False, "counters": []}
