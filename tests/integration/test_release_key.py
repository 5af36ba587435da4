"""A release with a key happens once: after a timeout or a failover the caller calls again, and
the ledger tells a repeat (nothing changes) from a different request under the same key."""

from __future__ import annotations

import threading

import pytest

from quota_ledger import IdempotencyConflict, QuotaEngine
from quota_ledger.cli import main


def _in_use(engine: QuotaEngine, queue: str, resource: str = "fpga") -> int:
    return engine.usage(queue)[resource].in_use


def _commit(engine: QuotaEngine, queue: str, amounts: dict[str, int], **who: str) -> None:
    made = engine.reserve(queue, amounts, **who)  # type: ignore[arg-type]
    engine.commit(made.id)


def test_a_keyed_release_repeated_releases_once(ledger: QuotaEngine) -> None:
    ledger.set_limits("root.a", {"fpga": 10})
    _commit(ledger, "root.a", {"fpga": 5})
    ledger.release("root.a", {"fpga": 2}, key="pod-1-gone")
    ledger.release("root.a", {"fpga": 2}, key="pod-1-gone")
    assert _in_use(ledger, "root.a") == 3
    ledger.release("root.a", {"fpga": 2}, key="pod-2-gone")
    assert _in_use(ledger, "root.a") == 1
    assert ledger.audit() == []


def test_a_key_reused_for_another_request_is_refused_and_changes_nothing(ledger: QuotaEngine) -> None:
    ledger.set_limits("root.a", {"fpga": 10})
    _commit(ledger, "root.a", {"fpga": 5})
    ledger.release("root.a", {"fpga": 2}, key="k")
    with pytest.raises(IdempotencyConflict) as refused:
        ledger.release("root.a", {"fpga": 1}, key="k")
    assert refused.value.key == "k"
    with pytest.raises(IdempotencyConflict):
        ledger.release("root.b", {"fpga": 2}, key="k")
    assert _in_use(ledger, "root.a") == 3
    # Keys are per partition.
    ledger.set_limits("root.a", {"fpga": 10}, partition="other")
    _commit(ledger, "root.a", {"fpga": 4}, partition="other")
    ledger.release("root.a", {"fpga": 1}, key="k", partition="other")
    assert ledger.usage("root.a", partition="other")["fpga"].in_use == 3


def test_a_keyed_release_of_a_users_application_repeats_safely(ledger: QuotaEngine) -> None:
    ledger.set_limits("root.a", {"fpga": 10})
    _commit(ledger, "root.a", {"fpga": 4}, user="alice", application="app-1")
    for _ in range(3):
        ledger.release("root.a", {"fpga": 1}, user="alice", application="app-1", key="alice-1")
    assert _in_use(ledger, "root.a") == 3
    report = ledger.user_usage("alice")
    assert report["queues"]["resourceUsage"]["fpga"] == 3
    assert ledger.audit() == []


def test_concurrent_calls_with_one_key_release_once(server_ledger: QuotaEngine) -> None:
    server_ledger.set_limits("root.a", {"fpga": 1000})
    _commit(server_ledger, "root.a", {"fpga": 100})
    start = threading.Barrier(8)
    errors: list[BaseException] = []

    def twin(n: int) -> None:
        start.wait()
        try:
            server_ledger.release("root.a", {"fpga": 7}, key=f"burst-{n % 2}")
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=twin, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert _in_use(server_ledger, "root.a") == 100 - 2 * 7
    assert server_ledger.audit() == []


def test_the_cli_release_takes_a_key(ledger: QuotaEngine, capsys: pytest.CaptureFixture[str]) -> None:
    ledger.set_limits("root.a", {"fpga": 10})
    _commit(ledger, "root.a", {"fpga": 5})
    url = ledger.driver.url.render_as_string(hide_password=False)
    for _ in range(2):
        assert main(["--db", url, "release", "root.a", "fpga=2", "--key", "gone-1"]) == 0
    capsys.readouterr()
    assert _in_use(ledger, "root.a") == 3
