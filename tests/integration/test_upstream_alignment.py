"""Where the ledger follows YuniKorn on a database: application ids, empty documents and
partition names in configurations."""

from __future__ import annotations

import pytest

from quota_ledger import ConfigError, InvalidRequest, OverQuota, QuotaEngine
from quota_ledger.ledger.configure import EMPTY_DOCUMENT

LIMITED = """
partitions:
  - name: default
    queues:
      - name: root
        queues:
          - name: a
            maxapplications: 1
          - name: b
"""


def test_an_application_id_is_free_again_once_its_only_reservation_is_rolled_back(
    ledger: QuotaEngine,
) -> None:
    first = ledger.reserve("root.a", {"memory": "1"}, user="user1", application="app1")
    with pytest.raises(InvalidRequest, match="belongs to user 'user1'"):
        ledger.reserve("root.a", {"memory": "1"}, user="user2", application="app1")  # still running
    ledger.rollback(first.id)
    second = ledger.reserve("root.b", {"memory": "1"}, user="user2", application="app1")
    assert (second.user, second.queue, second.application) == ("user2", "root.b", "app1")
    ledger.commit(second.id)
    ledger.release("root.b", {"memory": "1"}, user="user2", application="app1")
    assert ledger.audit() == []


def test_an_application_whose_usage_returns_to_zero_stops_running(ledger: QuotaEngine) -> None:
    ledger.apply_config(LIMITED)
    held = ledger.reserve("root.a", {"memory": "2"}, application="app1")
    ledger.commit(held.id)
    with pytest.raises(OverQuota):
        ledger.reserve("root.a", {"memory": "1"}, application="app2")
    ledger.release("root.a", {"memory": "1"}, application="app1")  # some still held: running
    with pytest.raises(OverQuota):
        ledger.reserve("root.a", {"memory": "1"}, application="app2")
    ledger.release("root.a", {"memory": "1"}, application="app1")  # nothing held: finished
    assert ledger.application_summary("app1")["state"] == "Completed"
    ledger.reserve("root.a", {"memory": "1"}, application="app2")
    assert ledger.audit() == []


def test_an_empty_document_validates_and_applies_only_where_it_removes_nothing(ledger: QuotaEngine) -> None:
    assert ledger.validate_config("") == []
    assert ledger.apply_config("") == 1  # nothing configured yet: the default configuration
    ledger.apply_config(LIMITED)
    with pytest.raises(ConfigError) as refused:
        ledger.apply_config("# nothing\n")
    assert refused.value.problems == [EMPTY_DOCUMENT]
    assert ledger.validate_config("") == [EMPTY_DOCUMENT]  # validation agrees with apply
    assert ledger.limits() == {"root.a": {"applications": 1}}


@pytest.mark.parametrize("name", ["a b", "a\x01", "ä", "x'; DROP TABLE reservations; --", "p" * 65])
def test_partition_names_in_a_configuration_are_checked_as_reserve_checks_them(
    ledger: QuotaEngine, name: str
) -> None:
    document = {"partitions": [{"name": name, "queues": [{"name": "root", "queues": [{"name": "a"}]}]}]}
    with pytest.raises(InvalidRequest):
        ledger.reserve("root.a", {"memory": "1"}, partition=name)
    [problem] = ledger.validate_config(document)
    assert (problem.partition, problem.queue) == (name, "")
    assert problem.message.startswith("invalid partition name")
    with pytest.raises(ConfigError) as refused:
        ledger.apply_config(document)
    assert refused.value.problems == [problem]
    assert ledger.config_version() == 0
