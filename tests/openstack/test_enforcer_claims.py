"""What the ledger's enforcer does beyond oslo.limit: claims (commit on leaving the block,
rollback on an exception, expiry after a crash, retries by key, releases), the
strict_two_level model, Keystone's units, and concurrent claims at a limit on every decision path."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from oslo_limit import exception

from quota_ledger import QuotaEngine, ReservationState
from quota_ledger.openstack import Enforcer
from quota_ledger.openstack.sources import GivenLimits
from quota_ledger.openstack.unified_limits import (
    DomainLimit,
    EnforcementModel,
    KeystoneLimits,
    Project,
    ProjectLimit,
    RegisteredLimit,
)

CYBORG = "svc-cyborg"
NOVA = "svc-nova"


def flat(**registered: int) -> GivenLimits:
    return GivenLimits(
        KeystoneLimits(
            model=EnforcementModel.FLAT,
            registered=tuple(
                RegisteredLimit(service_id=CYBORG, resource_name=name, default_limit=value)
                for name, value in registered.items()
            ),
        )
    )


STRICT = GivenLimits(
    KeystoneLimits(
        model=EnforcementModel.STRICT_TWO_LEVEL,
        registered=(RegisteredLimit(service_id=CYBORG, resource_name="fpga", default_limit=8),),
        project_limits=(
            ProjectLimit(project_id="big", service_id=CYBORG, resource_name="fpga", resource_limit=20),
        ),
        domain_limits=(
            DomainLimit(domain_id="d1", service_id=CYBORG, resource_name="fpga", resource_limit=10),
        ),
        projects=(
            Project(id="alpha", domain_id="d1"),
            Project(id="beta", domain_id="d1"),
            Project(id="big", domain_id="d1"),
            Project(id="other", domain_id="d2"),
        ),
    )
)


@pytest.fixture
def engine(sqlite_template: Path, tmp_path: Path) -> Iterator[QuotaEngine]:
    path = tmp_path / "ledger.db"
    shutil.copy(sqlite_template, path)
    with QuotaEngine.from_url(f"sqlite:///{path}") as ledger:
        yield ledger


def infos(over: exception.ProjectOverLimit) -> list[tuple[str, int, int, int]]:
    return [(i.resource_name, i.limit, i.current_usage, i.delta) for i in over.over_limit_info_list]


def fpga(engine: QuotaEngine, queue: str) -> tuple[int, int]:
    usage = engine.usage(queue)["fpga"]
    return usage.in_use, usage.reserved


def test_leaving_the_block_commits(engine: QuotaEngine) -> None:
    enforcer = Enforcer(None, ledger=engine, limits=flat(fpga=5))
    with enforcer.claim("p", {"fpga": 2}) as held:
        assert fpga(engine, "root.p") == (0, 2)
    assert held.state is ReservationState.COMMITTED
    assert fpga(engine, "root.p") == (2, 0)


def test_an_exception_in_the_block_rolls_back_and_is_raised(engine: QuotaEngine) -> None:
    enforcer = Enforcer(None, ledger=engine, limits=flat(fpga=5))
    with pytest.raises(RuntimeError, match="attachment failed"), enforcer.claim("p", {"fpga": 2}) as held:
        raise RuntimeError("attachment failed")
    assert held.state is ReservationState.ROLLED_BACK
    assert fpga(engine, "root.p") == (0, 0)


def test_a_claim_of_a_crashed_process_expires_after_its_ttl(engine: QuotaEngine) -> None:
    enforcer = Enforcer(None, ledger=engine, limits=flat(fpga=5))
    held = enforcer.reserve("p", {"fpga": 5}, ttl=1)
    with pytest.raises(exception.ProjectOverLimit):
        enforcer.enforce("p", {"fpga": 1})
    time.sleep(1.5)
    assert engine.expire() == 1
    assert engine.get(held.id).state is ReservationState.EXPIRED
    enforcer.enforce("p", {"fpga": 5})


def test_a_retry_with_the_same_key_is_the_same_claim(engine: QuotaEngine) -> None:
    enforcer = Enforcer(None, ledger=engine, limits=flat(fpga=5))
    first = enforcer.reserve("p", {"fpga": 3}, key="arq-1")
    again = enforcer.reserve("p", {"fpga": 3}, key="arq-1")
    assert again.id == first.id
    assert fpga(engine, "root.p") == (0, 3)


def test_a_release_counts_resources_as_gone(engine: QuotaEngine) -> None:
    enforcer = Enforcer(None, ledger=engine, limits=flat(fpga=5))
    with enforcer.claim("p", {"fpga": 5}):
        pass
    enforcer.release("p", {"fpga": 2}, key="detach-1")
    enforcer.release("p", {"fpga": 2}, key="detach-1")
    assert fpga(engine, "root.p") == (3, 0)
    with enforcer.claim("p", {"fpga": 2}):
        pass


def test_a_claim_over_the_limit_reserves_nothing(engine: QuotaEngine) -> None:
    enforcer = Enforcer(None, ledger=engine, limits=flat(fpga=5, widgets=3))
    with enforcer.claim("p", {"fpga": 4}):
        pass
    with pytest.raises(exception.ProjectOverLimit) as refused, enforcer.claim("p", {"fpga": 2, "widgets": 4}):
        pass
    assert refused.value.project_id == "p"
    assert infos(refused.value) == [("fpga", 5, 4, 2), ("widgets", 3, 0, 4)]
    assert fpga(engine, "root.p") == (4, 0)


def test_strict_two_level_a_domain_caps_its_projects_together(engine: QuotaEngine) -> None:
    enforcer = Enforcer(None, ledger=engine, limits=STRICT)
    with enforcer.claim("alpha", {"fpga": 6}):
        pass
    with pytest.raises(exception.ProjectOverLimit) as refused, enforcer.claim("beta", {"fpga": 5}):
        pass
    assert infos(refused.value) == [("fpga", 10, 6, 5)]  # beta's own 8 holds 5; d1's 10 does not
    with pytest.raises(exception.ProjectOverLimit) as again:
        enforcer.enforce("beta", {"fpga": 5})
    assert infos(again.value) == infos(refused.value)
    with enforcer.claim("beta", {"fpga": 4}):
        pass
    assert fpga(engine, "root.d1") == (10, 0)
    with enforcer.claim("other", {"fpga": 8}):  # another domain: its own default only
        pass


def test_strict_two_level_the_project_limit_then_the_domain_limit(engine: QuotaEngine) -> None:
    enforcer = Enforcer(None, ledger=engine, limits=STRICT)
    with enforcer.claim("beta", {"fpga": 3}):
        pass
    with pytest.raises(exception.ProjectOverLimit) as refused, enforcer.claim("alpha", {"fpga": 9}):
        pass
    assert infos(refused.value) == [("fpga", 8, 0, 9), ("fpga", 10, 3, 9)]
    assert enforcer.calculate_usage("alpha", ["fpga"])["fpga"] == (8, 0)
    assert enforcer.get_project_limits("big", ["fpga"]) == [("fpga", 20)]
    assert enforcer.calculate_usage("big", ["fpga"])["fpga"] == (20, 0)
    # a project's limit above its domain's is capped by it in the ledger
    enforcer.enforce("big", {"fpga": 0})
    assert engine.limits()["root.d1.big"]["fpga"] == 10


def test_strict_two_level_needs_the_ledger_to_count() -> None:
    with pytest.raises(ValueError, match="strict_two_level"):
        Enforcer(lambda project_id, names: dict.fromkeys(names, 0), limits=STRICT)


def test_keystone_units_are_kept_and_the_ledger_counts_its_own() -> None:
    limits = GivenLimits(
        KeystoneLimits(
            model=EnforcementModel.FLAT,
            registered=(
                RegisteredLimit(service_id=NOVA, resource_name="class:VCPU", default_limit=4),
                RegisteredLimit(service_id=NOVA, resource_name="class:MEMORY_MB", default_limit=2048),
            ),
            services={NOVA: "compute"},
        )
    )
    with QuotaEngine.from_url("sqlite://") as engine:
        engine.migrate()
        enforcer = Enforcer(None, ledger=engine, limits=limits)
        with enforcer.claim("p", {"class:VCPU": 3, "class:MEMORY_MB": 1024}):
            pass
        counted = engine.usage("root.p")
        assert (counted["vcore"].in_use, counted["memory"].in_use) == (3000, 1024 * 2**20)
        with pytest.raises(exception.ProjectOverLimit) as refused:
            enforcer.reserve("p", {"class:VCPU": 2, "class:MEMORY_MB": 1024})
        assert infos(refused.value) == [("class:VCPU", 4, 3, 2)]
        assert enforcer.calculate_usage("p", ["class:MEMORY_MB"])["class:MEMORY_MB"] == (2048, 1024)


def test_claims_at_a_limit_admit_exactly_the_limit(path_ledger: QuotaEngine) -> None:
    enforcer = Enforcer(None, ledger=path_ledger, limits=flat(fpga=5))
    enforcer.enforce("p", {"fpga": 0})  # the project's queue, before the threads race
    admitted: list[int] = []
    refused: list[int] = []
    start = threading.Barrier(16)

    def request(number: int) -> None:
        start.wait()
        try:
            with enforcer.claim("p", {"fpga": 1}, key=f"request-{number}"):
                time.sleep(0.02)
                admitted.append(number)
        except exception.ProjectOverLimit:
            refused.append(number)

    threads = [threading.Thread(target=request, args=(n,)) for n in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert (len(admitted), len(refused)) == (5, 11)
    assert fpga(path_ledger, "root.p") == (5, 0)


def test_claims_of_a_domains_projects_at_once_admit_exactly_the_domains_limit(
    path_ledger: QuotaEngine,
) -> None:
    enforcer = Enforcer(None, ledger=path_ledger, limits=STRICT)
    for project in ("alpha", "beta"):
        enforcer.enforce(project, {"fpga": 0})
    admitted: list[str] = []
    start = threading.Barrier(24)

    def request(number: int) -> None:
        project = ("alpha", "beta")[number % 2]
        start.wait()
        try:
            with enforcer.claim(project, {"fpga": 1}, key=f"request-{number}"):
                admitted.append(project)
        except exception.ProjectOverLimit:
            pass

    threads = [threading.Thread(target=request, args=(n,)) for n in range(24)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(admitted) == 10
    assert max(admitted.count("alpha"), admitted.count("beta")) <= 8
    assert fpga(path_ledger, "root.d1") == (10, 0)


def test_projects_met_by_two_enforcers_keep_each_others_queues(engine: QuotaEngine) -> None:
    one = Enforcer(None, ledger=engine, limits=flat(fpga=5))
    two = Enforcer(None, ledger=engine, limits=flat(fpga=5))
    one.enforce("a", {"fpga": 1})
    two.enforce("b", {"fpga": 1})
    one.enforce("c", {"fpga": 1})
    assert {"root.a", "root.b", "root.c"} <= set(engine.limits())


def test_a_projects_queue_removed_behind_the_enforcer_is_put_back_and_its_limit_holds(
    engine: QuotaEngine,
) -> None:
    enforcer = Enforcer(None, ledger=engine, limits=flat(fpga=5))
    with enforcer.claim("p", {"fpga": 5}):
        pass
    enforcer.enforce("q", {"fpga": 0})

    def without_p(document: dict[str, Any]) -> dict[str, Any]:
        root = document["partitions"][0]["queues"][0]
        root["queues"] = [queue for queue in root["queues"] if queue["name"] != "p"]
        return document

    engine.edit_config(without_p)  # as a sync that read Keystone before p existed
    assert "root.p" not in engine.limits()
    with pytest.raises(exception.ProjectOverLimit) as refused:
        enforcer.reserve("p", {"fpga": 1})
    assert infos(refused.value) == [("fpga", 5, 5, 1)]
    assert engine.limits()["root.p"] == {"fpga": 5}
    assert fpga(engine, "root.p") == (5, 0)
    enforcer.release("p", {"fpga": 1})
    with enforcer.claim("p", {"fpga": 1}):
        pass
