"""``list_reservations`` filters a partition's reservations by queue subtree, state, user,
application and age, oldest first and bounded. On every backend."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sql_rows import execute
from sqlalchemy.engine import URL

from quota_ledger import InvalidRequest, QuotaEngine


def test_each_filter_narrows_the_listing(ledger: QuotaEngine) -> None:
    team = ledger.reserve("root.dev.team", {"vcore": 1}, user="sue", application="app-1")
    dev = ledger.reserve("root.dev", {"vcore": 1}, user="bob")
    sibling = ledger.reserve("root.devices", {"vcore": 1})  # a name sharing the prefix only
    ledger.commit(sibling.id)
    other = ledger.reserve("root.dev", {"vcore": 1}, partition="other")
    assert [r.id for r in ledger.list_reservations()] == [team.id, dev.id, sibling.id]
    assert [r.id for r in ledger.list_reservations(queue="root.dev")] == [team.id, dev.id]
    assert [r.id for r in ledger.list_reservations(queue="root.dev.team")] == [team.id]
    assert [r.id for r in ledger.list_reservations(state="committed")] == [sibling.id]
    assert [r.id for r in ledger.list_reservations(state="pending", user="bob")] == [dev.id]
    assert [r.id for r in ledger.list_reservations(application="app-1")] == [team.id]
    assert [r.id for r in ledger.list_reservations(partition="other")] == [other.id]
    assert [r.id for r in ledger.list_reservations(limit=2)] == [team.id, dev.id]
    assert ledger.list_reservations(older_than="1h") == []
    found = ledger.list_reservations(queue="root.dev.team")[0]
    assert (found.user, found.application, found.resources) == ("sue", "app-1", {"vcore": 1000})


def test_older_than_counts_against_the_database_clock(ledger: QuotaEngine, db_url: URL) -> None:
    old = ledger.reserve("root.a", {"vcore": 1}, ttl=7200)
    new = ledger.reserve("root.a", {"vcore": 1}, ttl=7200)
    stored = "UPDATE reservations SET created_at = :at WHERE id = :id"
    made = ledger.get(old.id).created_at.replace(tzinfo=None)
    execute(db_url, stored, {"at": made - timedelta(hours=3), "id": old.id})
    assert [r.id for r in ledger.list_reservations(older_than="2h")] == [old.id]
    assert [r.id for r in ledger.list_reservations(older_than="1h30m")] == [old.id]
    assert [r.id for r in ledger.list_reservations(older_than=timedelta(hours=4))] == []
    assert {r.id for r in ledger.list_reservations(older_than="0s")} <= {old.id, new.id}


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"state": "stuck"}, "state"),
        ({"older_than": "ten minutes"}, "older_than"),
        ({"limit": 0}, "limit"),
        ({"limit": 1001}, "limit"),
        ({"queue": "nope"}, "queue"),
    ],
)
def test_a_bad_filter_names_its_field(ledger: QuotaEngine, options: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        ledger.list_reservations(**options)  # type: ignore[arg-type]
    assert caught.value.field == field
