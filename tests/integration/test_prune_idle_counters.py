"""``prune`` lists the counters at zero that nothing references and, with ``apply``, deletes
them, all or nothing; never one a concurrent reservation is using. On every backend."""

from __future__ import annotations

import threading

from sql_rows import rows
from sqlalchemy.engine import URL

from quota_ledger import QuotaEngine
from quota_ledger.model.values import IdleCounter

CONFIG = """
partitions:
  - name: default
    queues:
      - name: root
        queues:
          - name: dev
            resources: {max: {vcore: 8}}
            limits:
              - {limit: sue, users: [sue], maxresources: {vcore: 6}}
              - {limit: others, users: ["*"], maxresources: {vcore: 4}}
"""


def _counted(url: URL) -> int:
    queue_rows = rows(url, "SELECT COUNT(*) FROM quota_usages")[0][0]
    return int(queue_rows) + int(rows(url, "SELECT COUNT(*) FROM quota_identity_usages")[0][0])


def _left_behind(engine: QuotaEngine) -> None:
    """A typo resource, an unknown queue and a departed user, each back at zero; sue keeps a
    reservation, and her configured limit's counter stays however it stands."""
    for queue, resources, user in (
        ("root.dev", {"vcore": 1, "gpus": 1}, "bob"),
        ("root.nope", {"vcore": 1}, None),
        ("root.dev", {"vcore": 1}, "sue"),
    ):
        made = engine.reserve(queue, resources, user=user, application=f"app-{user}" if user else None)
        engine.rollback(made.id)
    engine.reserve("root.dev.team", {"vcore": 1}, user="ann", application="kept")


def test_a_dry_run_lists_and_apply_deletes_only_what_nothing_references(
    ledger: QuotaEngine, db_url: URL
) -> None:
    ledger.apply_config(CONFIG)
    _left_behind(ledger)
    before = _counted(db_url)
    idle = ledger.prune()
    assert sorted((c.kind, c.queue, c.resource, c.name) for c in idle) == [
        ("queue", "root.dev", "gpus", None),
        ("queue", "root.nope", "vcore", None),
        ("user", "root.dev", "vcore", "bob"),
    ]
    assert _counted(db_url) == before  # a dry run changes nothing
    assert ledger.prune(apply=True) == idle
    assert _counted(db_url) == before - 3
    assert ledger.prune() == []
    assert ledger.audit() == []
    again = ledger.reserve("root.nope", {"vcore": 1}, user="bob", application="b2")
    assert ledger.usage("root.nope")["vcore"].reserved == 1000
    assert ledger.get(again.id).state.value == "pending"


def test_prune_of_one_partition_leaves_the_others(ledger: QuotaEngine) -> None:
    ledger.rollback(ledger.reserve("root.x", {"fpga": 1}, partition="a").id)
    ledger.rollback(ledger.reserve("root.x", {"fpga": 1}, partition="b").id)
    expected = [IdleCounter(partition="a", kind="queue", queue="root.x", resource="fpga")]
    assert ledger.prune(apply=True, partition="a") == expected
    assert [c.partition for c in ledger.prune()] == ["b"]
    assert ledger.prune(apply=True, partition="none-such") == []
    assert "none-such" not in ledger.driver.partitions()


def test_prune_never_deletes_a_counter_a_concurrent_reservation_uses(ledger: QuotaEngine) -> None:
    ledger.apply_config(CONFIG)
    failures: list[BaseException] = []
    stop = threading.Event()

    def reserve_and_roll_back() -> None:
        try:
            for _ in range(25):
                made = ledger.reserve("root.nope", {"vcore": 1, "gpus": 1})
                ledger.rollback(made.id)
        except BaseException as error:  # reported below
            failures.append(error)
        finally:
            stop.set()

    worker = threading.Thread(target=reserve_and_roll_back)
    worker.start()
    pruned = 0
    while not stop.is_set():
        pruned += len(ledger.prune(apply=True))
    worker.join()
    assert failures == []
    assert ledger.audit() == []
    held = ledger.reserve("root.nope", {"vcore": 1, "gpus": 1})
    assert ledger.prune() == []  # in use again: kept
    assert ledger.usage("root.nope")["gpus"].reserved == 1
    ledger.rollback(held.id)
    assert {c.resource for c in ledger.prune(apply=True)} == {"vcore", "gpus"}
