"""The Keystone sync against a real Keystone: both enforcement models, changes and no changes,
deleted and new projects, Keystone down, and concurrent reservations at a synced limit."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from keystone_server import KeystoneServer
from keystoneauth1 import session as ks_session
from keystoneauth1.identity import v3

from quota_ledger import QuotaEngine
from quota_ledger.model.errors import ManagedQueue, OverQuota
from quota_ledger.openstack.keystone import KeystoneReader, KeystoneUnreachable
from quota_ledger.openstack.sync import KeystoneSync, SyncOptions

pytestmark = pytest.mark.keystone
MIB = 2**20


class Cloud:
    """The admin's view of a test's own service, domain and projects in the shared Keystone."""

    def __init__(self, server: KeystoneServer) -> None:
        self.server = server
        self.tag = uuid.uuid4().hex[:8]
        found = server.call("POST", "/services", {"service": {"type": "compute", "name": f"nova-{self.tag}"}})
        self.service = found["service"]["id"]

    def domain(self) -> str:
        made = self.server.call("POST", "/domains", {"domain": {"name": f"d-{uuid.uuid4().hex[:8]}"}})
        return str(made["domain"]["id"])

    def project(self, domain: str = "default") -> str:
        body = {"project": {"name": f"p-{uuid.uuid4().hex[:8]}", "domain_id": domain}}
        return str(self.server.call("POST", "/projects", body)["project"]["id"])

    def registered(self, resource: str, default: int) -> None:
        body = {"service_id": self.service, "resource_name": resource, "default_limit": default}
        self.server.call("POST", "/registered_limits", {"registered_limits": [body]})

    def limit(
        self, resource: str, value: int, *, project: str | None = None, domain: str | None = None
    ) -> str:
        body: dict[str, Any] = {
            "service_id": self.service,
            "resource_name": resource,
            "resource_limit": value,
        }
        body.update({"project_id": project} if project else {"domain_id": domain})
        return str(self.server.call("POST", "/limits", {"limits": [body]})["limits"][0]["id"])

    def sync(self, engine: QuotaEngine, reader: KeystoneReader | None = None) -> KeystoneSync:
        return KeystoneSync(engine, reader or self.reader(), SyncOptions(services=(self.service,)))

    def reader(self, kind: type[KeystoneReader] = KeystoneReader) -> KeystoneReader:
        auth = v3.Password(
            auth_url=self.server.url,
            username="admin",
            password=self.server.auth()["password"],
            user_domain_id="default",
            system_scope="all",
        )
        return kind(ks_session.Session(auth=auth))


class CountingReader(KeystoneReader):
    """A real reader that counts its on-demand project lookups."""

    def __init__(self, session: Any) -> None:
        super().__init__(session)
        self.lookups: list[str] = []

    def project(self, project_id: str) -> Any:
        self.lookups.append(project_id)
        return super().project(project_id)


@pytest.fixture
def flat(keystone_flat: KeystoneServer) -> Cloud:
    return Cloud(keystone_flat)


@pytest.fixture
def strict(keystone_strict: KeystoneServer) -> Cloud:
    return Cloud(keystone_strict)


def test_flat_sync_makes_a_queue_per_project_from_registered_and_own_limits(
    ledger: QuotaEngine, flat: Cloud
) -> None:
    p1, p2 = flat.project(), flat.project()
    flat.registered("class:VCPU", 4)
    flat.registered("class:MEMORY_MB", 1024)
    flat.limit("class:VCPU", 8, project=p1)
    result = flat.sync(ledger).sync_once()
    assert result.changed
    assert {f"root.{p1}", f"root.{p2}"} <= set(result.queues)
    limits = ledger.limits()
    assert limits[f"root.{p1}"] == {"memory": 1024 * MIB, "vcore": 8000}
    assert limits[f"root.{p2}"] == {"memory": 1024 * MIB, "vcore": 4000}
    with pytest.raises(ManagedQueue, match="Keystone"):
        ledger.set_limits(f"root.{p1}", {"vcore": "100"})


def test_a_changed_limit_makes_one_version_and_no_change_makes_none(ledger: QuotaEngine, flat: Cloud) -> None:
    project = flat.project()
    flat.registered("servers", 10)
    limit = flat.limit("servers", 3, project=project)
    syncer = flat.sync(ledger)
    first = syncer.sync_once()
    again = syncer.sync_once()
    assert (again.changed, again.version) == (False, first.version)
    flat.server.call("PATCH", f"/limits/{limit}", {"limit": {"resource_limit": 5}})
    changed = syncer.sync_once()
    assert (changed.changed, changed.version) == (True, first.version + 1)
    assert ledger.limits()[f"root.{project}"] == {"servers": 5}
    assert syncer.sync_once().version == changed.version
    assert ledger.config_version() == changed.version


def test_a_deleted_project_queue_goes_with_the_next_sync(ledger: QuotaEngine, flat: Cloud) -> None:
    project, kept = flat.project(), flat.project()
    flat.registered("servers", 2)
    syncer = flat.sync(ledger)
    syncer.sync_once()
    ledger.commit(ledger.reserve(f"root.{project}", {"servers": "1"}).id)
    flat.server.call("DELETE", f"/projects/{project}")
    result = syncer.sync_once()
    assert result.changed
    assert f"root.{project}" not in ledger.limits()
    assert ledger.limits()[f"root.{kept}"] == {"servers": 2}


def test_keystone_down_keeps_the_last_limits_and_their_age_grows(ledger: QuotaEngine, flat: Cloud) -> None:
    project = flat.project()
    flat.registered("servers", 2)
    syncer = flat.sync(ledger)
    version = syncer.sync_once().version
    flat.server.stop()
    try:
        before = syncer.age_seconds()
        assert before is not None
        time.sleep(0.2)
        with pytest.raises(KeystoneUnreachable):
            syncer.sync_once()
        age = syncer.age_seconds()
        assert age is not None
        assert age >= before + 0.2
        assert syncer.failures == 1
        assert ledger.config_version() == version
        assert ledger.limits()[f"root.{project}"] == {"servers": 2}
        with pytest.raises(OverQuota):
            ledger.reserve(f"root.{project}", {"servers": "3"})
    finally:
        flat.server.start("flat")


def test_a_project_made_after_the_sync_is_looked_up_once(ledger: QuotaEngine, flat: Cloud) -> None:
    flat.registered("servers", 2)
    counting = flat.reader(CountingReader)
    assert isinstance(counting, CountingReader)
    syncer = flat.sync(ledger, counting)
    syncer.sync_once()
    late = flat.project()
    flat.limit("servers", 7, project=late)
    assert syncer.ensure_project(late) == f"root.{late}"
    assert syncer.ensure_project(late) == f"root.{late}"
    assert ledger.limits()[f"root.{late}"] == {"servers": 7}
    missing = uuid.uuid4().hex
    assert syncer.ensure_project(missing) is None
    assert syncer.ensure_project(missing) is None
    assert counting.lookups == [late, missing]


def test_sixteen_concurrent_reserves_at_a_synced_limit_admit_exactly_the_limit(
    ledger: QuotaEngine, flat: Cloud
) -> None:
    project = flat.project()
    flat.registered("servers", 100)
    flat.limit("servers", 5, project=project)
    flat.sync(ledger).sync_once()
    admitted: list[str] = []
    refused: list[OverQuota] = []
    start = threading.Barrier(16)

    def reserve() -> None:
        start.wait()
        try:
            admitted.append(ledger.reserve(f"root.{project}", {"servers": "1"}).id)
        except OverQuota as exc:
            refused.append(exc)

    threads = [threading.Thread(target=reserve) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert (len(admitted), len(refused)) == (5, 11)
    assert ledger.usage(f"root.{project}")["servers"].reserved == 5


def test_strict_two_level_nests_projects_under_their_domain_which_caps_them(
    ledger: QuotaEngine, strict: Cloud
) -> None:
    domain = strict.domain()
    p1, p2 = strict.project(domain), strict.project(domain)
    strict.registered("class:VCPU", 4)
    strict.limit("class:VCPU", 10, domain=domain)
    strict.limit("class:VCPU", 8, project=p1)
    result = strict.sync(ledger).sync_once()
    assert {f"root.{domain}.{p1}", f"root.{domain}.{p2}"} <= set(result.queues)
    limits = ledger.limits()
    assert limits[f"root.{domain}"] == {"vcore": 10_000}
    assert limits[f"root.{domain}.{p1}"] == {"vcore": 8000}
    assert limits[f"root.{domain}.{p2}"] == {"vcore": 4000}
    ledger.reserve(f"root.{domain}.{p1}", {"vcore": "8"})
    with pytest.raises(OverQuota) as over:
        ledger.reserve(f"root.{domain}.{p2}", {"vcore": "3"})
    assert [v.scope for v in over.value.violations] == [f"root.{domain}"]
    ledger.reserve(f"root.{domain}.{p2}", {"vcore": "2"})


def test_the_command_syncs_from_a_clouds_yaml_cloud_without_showing_the_password(
    sqlite_template: Path, strict: Cloud, tmp_path: Path
) -> None:
    db_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    shutil.copy(sqlite_template, tmp_path / "ledger.db")
    strict.registered("servers", 3)
    domain = strict.domain()
    project = strict.project(domain)
    password = strict.server.auth()["password"]
    clouds = {
        "clouds": {
            "test": {
                "auth": {
                    "auth_url": strict.server.url,
                    "username": "admin",
                    "password": password,
                    "user_domain_id": "default",
                    "system_scope": "all",
                },
                "region_name": "RegionOne",
                "identity_api_version": 3,
            }
        }
    }
    (tmp_path / "clouds.yaml").write_text(yaml.safe_dump(clouds))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OS_", "QUOTA_LEDGER_"))}
    env["OS_CLIENT_CONFIG_FILE"] = str(tmp_path / "clouds.yaml")
    command = [sys.executable, "-m", "quota_ledger.cli", "--db", db_url, "openstack", "sync"]
    done = _run([*command, "--cloud", "test", "--service", strict.service, "--json"], env)
    assert done.returncode == 0, done.stderr
    assert f"root.{domain}.{project}" in yaml.safe_load(done.stdout)["queues"]
    looping = subprocess.Popen(
        [*command, "--cloud", "test", "--service", strict.service, "--every", "0.2"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = threading.Timer(60, looping.kill)  # a loop that prints nothing fails, not hangs
    deadline.start()
    try:
        assert looping.stdout is not None
        first, second = looping.stdout.readline(), looping.stdout.readline()
        assert "unchanged" in first
        assert "unchanged" in second
    finally:
        looping.send_signal(signal.SIGINT)
        assert looping.wait(timeout=60) == 0
        deadline.cancel()
    wrong = _run([*command, "--cloud", "nosuchcloud"], env)
    assert wrong.returncode == 1
    assert password not in wrong.stdout + wrong.stderr + done.stdout + done.stderr


def _run(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture(autouse=True)
def _no_proxy() -> Iterator[None]:
    """The loopback Keystone is never reached through a proxy of the machine."""
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.lower() in ("http_proxy", "https_proxy")}
    yield
    os.environ.update(saved)


def test_the_service_runs_the_sync_and_serves_the_age_of_the_limits(
    tmp_path: Path, flat: Cloud, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fastapi.testclient import TestClient

    from quota_ledger.http.app import create_app
    from quota_ledger.runtime import tokens
    from quota_ledger.runtime.settings import Settings

    project = flat.project()
    flat.registered("servers", 4)
    clouds = {
        "clouds": {
            "svc": {
                "auth": {**flat.server.auth(), "system_scope": "all"},
                "identity_api_version": 3,
            }
        }
    }
    for key in ("project_name", "project_domain_id"):
        clouds["clouds"]["svc"]["auth"].pop(key)
    (tmp_path / "clouds.yaml").write_text(yaml.safe_dump(clouds))
    monkeypatch.setenv("OS_CLIENT_CONFIG_FILE", str(tmp_path / "clouds.yaml"))
    settings = Settings(  # type: ignore[call-arg]
        db="sqlite://",
        openstack_sync_interval=0.2,
        openstack_cloud="svc",
        openstack_services=flat.service,
    )
    with QuotaEngine.from_url(f"sqlite:///{tmp_path / 'ledger.db'}") as engine:
        engine.migrate()
        reader = tokens.add(engine, "reader", "reader")
        app = create_app(engine, settings, sweep=False)
        with TestClient(app) as client:
            deadline = time.monotonic() + 30
            while f"root.{project}" not in engine.limits() and time.monotonic() < deadline:
                time.sleep(0.1)
            assert engine.limits()[f"root.{project}"] == {"servers": 4}
            text = client.get("/metrics", headers={"Authorization": f"Bearer {reader}"}).text
            [age] = [
                line
                for line in text.splitlines()
                if line.startswith("quota_ledger_openstack_limits_age_seconds ")
            ]
            assert 0 <= float(age.split()[1]) < 30
            assert "quota_ledger_openstack_sync_failures 0.0" in text
            assert app.state.keystone_sync.ensure_project(project) == f"root.{project}"
