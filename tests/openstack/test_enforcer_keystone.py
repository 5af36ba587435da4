"""The enforcer against a real Keystone, reading it the way oslo.limit does (the ``[oslo_limit]``
options, an endpoint, a system-scoped admin): the same answers as oslo.limit's own enforcer
under the flat model, and under strict_two_level, which oslo.limit's refuses, a domain's limit
holding for its projects together; also with the sync's KeystoneReader as the source."""

from __future__ import annotations

import shutil
import threading
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from keystone_server import KeystoneServer
from keystoneauth1 import loading
from oslo_config import cfg
from oslo_config import fixture as config_fixture
from oslo_limit import exception, limit
from test_keystone_sync import Cloud

from quota_ledger import QuotaEngine
from quota_ledger.openstack import Enforcer
from quota_ledger.openstack.unified_limits import Selection

pytestmark = pytest.mark.keystone


@pytest.fixture
def engine(sqlite_template: Path, tmp_path: Path) -> Iterator[QuotaEngine]:
    path = tmp_path / "ledger.db"
    shutil.copy(sqlite_template, path)
    with QuotaEngine.from_url(f"sqlite:///{path}") as ledger:
        yield ledger


@contextmanager
def oslo_limit_options(cloud: Cloud, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``[oslo_limit]`` as a service configures it: an endpoint of the test's service, and the
    admin's system-scoped password; oslo.limit's connection made anew for them."""
    made = cloud.server.call(
        "POST",
        "/endpoints",
        {
            "endpoint": {
                "service_id": cloud.service,
                "interface": "public",
                "url": f"http://{uuid.uuid4().hex}.test",
            }
        },
    )
    monkeypatch.setattr(limit, "_SDK_CONNECTION", None)
    with config_fixture.Config(cfg.CONF) as conf:
        # what keystoneauth1 registers when it loads the plugin, registered first to be set here
        cfg.CONF.register_opts(loading.get_auth_plugin_conf_options("password"), group="oslo_limit")
        conf.config(
            group="oslo_limit",
            endpoint_id=made["endpoint"]["id"],
            auth_type="password",
            auth_url=cloud.server.url,
            username="admin",
            password=cloud.server.auth()["password"],
            user_domain_id="default",
            system_scope="all",
        )
        yield


@pytest.fixture
def flat(keystone_flat: KeystoneServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cloud]:
    cloud = Cloud(keystone_flat)
    with oslo_limit_options(cloud, monkeypatch):
        yield cloud


@pytest.fixture
def strict(keystone_strict: KeystoneServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cloud]:
    cloud = Cloud(keystone_strict)
    with oslo_limit_options(cloud, monkeypatch):
        yield cloud


def infos(over: exception.ProjectOverLimit) -> list[tuple[str, int, int, int]]:
    return [(i.resource_name, i.limit, i.current_usage, i.delta) for i in over.over_limit_info_list]


def answer(call: object) -> object:
    try:
        return ("ok", call())  # type: ignore[operator]
    except exception.ProjectOverLimit as over:
        return ("over", over.project_id, infos(over))


def test_flat_the_enforcer_answers_as_oslo_limit_from_keystone(flat: Cloud, engine: QuotaEngine) -> None:
    own, other = flat.project(), flat.project()
    flat.registered("fpga", 5)
    flat.registered("servers", -1)
    flat.limit("fpga", 2, project=own)
    usage = {"fpga": 1, "servers": 40}

    def counting(project_id: str | None, names: Iterable[str]) -> dict[str, int]:
        return {name: usage.get(name, 0) for name in names}

    oslo = limit.Enforcer(counting)
    ledger = Enforcer(None, ledger=engine)
    with ledger.claim(own, {"fpga": 1, "servers": 40}), ledger.claim(other, {"fpga": 1, "servers": 40}):
        pass
    for project in (own, other):
        names = ["fpga", "servers", "unknown"]
        assert ledger.get_project_limits(project, names) == oslo.get_project_limits(project, names)
        assert ledger.calculate_usage(project, names) == oslo.calculate_usage(project, names)
        for deltas in ({"fpga": 1}, {"fpga": 4}, {"fpga": 5, "servers": 10**6}, {"unknown": 1}):
            expected = answer(lambda: oslo.enforce(project, deltas))  # noqa: B023
            assert answer(lambda: ledger.enforce(project, deltas)) == expected  # noqa: B023
            assert answer(lambda: Enforcer(counting).enforce(project, deltas)) == expected  # noqa: B023
    with pytest.raises(exception.ProjectOverLimit) as refused:
        ledger.reserve(own, {"fpga": 2})
    assert infos(refused.value) == [("fpga", 2, 1, 2)]


def test_strict_two_level_a_domain_caps_its_projects_where_oslo_limit_refuses_the_model(
    strict: Cloud, engine: QuotaEngine
) -> None:
    domain = strict.domain()
    alpha, beta = strict.project(domain), strict.project(domain)
    strict.registered("fpga", 8)
    strict.limit("fpga", 10, domain=domain)
    with pytest.raises(ValueError, match="not supported"):
        limit.Enforcer(lambda project_id, names: dict.fromkeys(names, 0))
    for limits in (None, strict.reader()):
        enforcer = Enforcer(
            None, ledger=engine, limits=limits, selection=Selection(service_ids=frozenset({strict.service}))
        )
        with enforcer.claim(alpha, {"fpga": 6}):
            pass
        with pytest.raises(exception.ProjectOverLimit) as refused, enforcer.claim(beta, {"fpga": 5}):
            pass
        assert infos(refused.value) == [("fpga", 10, 6, 5)]
        assert engine.limits()[f"root.{domain}"] == {"fpga": 10}
        enforcer.release(alpha, {"fpga": 6})


def test_sixteen_concurrent_claims_at_a_keystone_limit_admit_exactly_the_limit(
    flat: Cloud, engine: QuotaEngine
) -> None:
    """Sixteen claims at once on a project whose fpga limit Keystone sets at 5, read the way
    oslo.limit reads it: exactly 5 are admitted, and the 5 admitted are committed."""
    project = flat.project()
    flat.registered("fpga", 5)
    enforcer = Enforcer(None, ledger=engine)
    enforcer.get_project_limits(project, ["fpga"])  # the project's queue in place before the race
    start = threading.Barrier(16)
    outcomes: list[str] = []
    lock = threading.Lock()

    def claim() -> None:
        start.wait(timeout=30)
        try:
            with enforcer.claim(project, {"fpga": 1}):
                outcome = "admitted"
        except exception.ProjectOverLimit:
            outcome = "refused"
        with lock:
            outcomes.append(outcome)

    threads = [threading.Thread(target=claim) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert sorted(outcomes) == ["admitted"] * 5 + ["refused"] * 11
    assert enforcer.calculate_usage(project, ["fpga"])["fpga"].usage == 5
    assert engine.audit() == []
