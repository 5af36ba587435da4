"""Fixtures of the reconciler's tests: a fake API server on loopback, a ledger, reconcilers
running in threads against them."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from quota_ledger import QuotaEngine
from quota_ledger.reconciler.leader import LeaseConfig
from quota_ledger.reconciler.run import Reconciler
from quota_ledger.reconciler.settings import ReconcilerSettings
from tests.kube.fake_apiserver import FakeApiServer, running


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with running(bookmark_every=0.3) as server:
        yield server


@pytest.fixture
def engine(tmp_path: Path, sqlite_template: Path) -> Iterator[QuotaEngine]:
    """A fresh ledger on SQLite (the soak runs on every backend)."""
    path = tmp_path / "ledger.db"
    shutil.copy(sqlite_template, path)
    found = QuotaEngine.from_url(f"sqlite:///{path}")
    yield found
    found.close()


def eventually(check: Callable[[], Any], timeout: float = 15.0) -> Any:
    """``check()`` once it is truthy (polled), or fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"not so after {timeout} s: {check}")
        time.sleep(0.05)


class Running:
    """A reconciler in a thread of its own, and what stops it."""

    def __init__(self, reconciler: Reconciler) -> None:
        self.reconciler = reconciler
        self.stop = threading.Event()
        self.thread = threading.Thread(target=reconciler.run, args=(self.stop,), daemon=True)

    def metric(self, name: str, **labels: str) -> float:
        value = self.reconciler.metrics.registry.get_sample_value(name, labels)
        return value or 0.0

    def close(self) -> None:
        self.stop.set()
        self.thread.join(30)
        assert not self.thread.is_alive()


@contextmanager
def reconciling(
    api: FakeApiServer, engine: QuotaEngine, *, identity: str | None = None, **settings: Any
) -> Iterator[Running]:
    """A reconciler of ``engine`` against ``api``; with ``identity``, electing a leader on the
    Lease quota-ledger/quota-ledger-reconciler."""
    options = {"relist_every": 60.0, "watch_timeout": 5.0, **settings}
    lease = None
    if identity is not None:
        lease = LeaseConfig(
            name="quota-ledger-reconciler",
            namespace="quota-ledger",
            identity=identity,
            lease_duration=2.0,
            renew_deadline=1.5,
            retry_period=0.2,
        )
    configuration = client.Configuration(host=api.url)
    reconciler = Reconciler(
        engine,
        client.ApiClient(configuration),
        ReconcilerSettings(leader_election=lease is not None, **options),
        lease=lease,
    )
    found = Running(reconciler)
    found.thread.start()
    try:
        yield found
    finally:
        found.close()


def pod(name: str, cpu: str = "500m", namespace: str = "team", **spec: Any) -> dict[str, Any]:
    """A pod manifest, as a client sends it (the server gives it its uid)."""
    return {
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "containers": [{"name": "app", "image": "x", "resources": {"requests": {"cpu": cpu}}}],
            **spec,
        },
    }
