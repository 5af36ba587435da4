"""engine.edit_config: an edit of the configuration in force, applied under its lock, so that
editors at the same time never lose each other's change."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from sqlalchemy.engine import URL

from quota_ledger import ConfigError, QuotaEngine


def with_queue(name: str, fpga: int) -> Any:
    def edit(document: dict[str, Any]) -> dict[str, Any]:
        root = document["partitions"][0]["queues"][0]
        root.setdefault("queues", []).append({"name": name, "resources": {"max": {"fpga": str(fpga)}}})
        return document

    return edit


def test_an_edit_is_applied_as_a_new_version_and_no_change_makes_none(ledger: QuotaEngine) -> None:
    version = ledger.edit_config(with_queue("a", 2))
    assert ledger.limits()["root.a"] == {"fpga": 2}
    assert ledger.edit_config(lambda document: document) == version
    assert ledger.config_version() == version


def test_an_invalid_edit_is_refused_and_changes_nothing(ledger: QuotaEngine) -> None:
    version = ledger.edit_config(with_queue("a", 2))
    with pytest.raises(ConfigError):
        ledger.edit_config(with_queue("not a name!", 1))
    assert ledger.config_version() == version
    assert set(ledger.limits()) == {"root.a"}


def test_editors_at_the_same_time_keep_each_others_changes(db_url: URL) -> None:
    with QuotaEngine.from_url(db_url, pool_size=12) as engine:
        engine.edit_config(with_queue("first", 1))
        start = threading.Barrier(8)
        failures: list[BaseException] = []

        def editor(number: int) -> None:
            start.wait()
            try:
                engine.edit_config(with_queue(f"q{number}", number + 1))
            except BaseException as error:
                failures.append(error)

        threads = [threading.Thread(target=editor, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert failures == []
        assert set(engine.limits()) == {"root.first", *(f"root.q{n}" for n in range(8))}
