"""The service on SQLite (the default backend): the largest reservation a subtree's token may
make is committed, rolled back and expired; an error the service does not map is answered 500,
logged with its cause and counted; readiness reports a sweeper that keeps failing."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from http_support import Service, in_thread

from quota_ledger import QuotaEngine
from quota_ledger.http.app import create_app
from quota_ledger.model.errors import QuotaLedgerError
from quota_ledger.runtime import tokens
from quota_ledger.runtime.settings import Settings

#: 16 levels under a subtree the token is held to, 64 resources (the bound) and a user
DEEP = "root.dev." + ".".join(f"l{i}" for i in range(14))
RESOURCES = {f"r{i:02d}": "1" for i in range(64)}
BODY = {"queue": DEEP, "resources": RESOURCES, "user": "ann", "groups": ["dev"]}


@contextmanager
def serving(tmp_path: Path, **settings: Any) -> Iterator[Service]:
    """The service, its sweeper on, on a fresh SQLite database; tokens ``admin`` and ``dev`` (a
    service token held to root.dev)."""
    engine = QuotaEngine.from_url(f"sqlite:///{tmp_path / 'ledger.db'}")
    engine.migrate()
    issued = {
        "admin": tokens.add(engine, "admin", "admin"),
        "dev": tokens.add(engine, "dev", "service", partition="default", queue="root.dev"),
    }
    options = {"token_cache_seconds": 0.0, "sweep_interval": 0.05, **settings}
    app = create_app(engine, Settings(db="sqlite://", **options))  # type: ignore[call-arg]
    try:
        with in_thread(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning")) as port:
            yield Service(f"http://127.0.0.1:{port}", engine, issued)
    finally:
        engine.close()


def eventually(check: Callable[[], bool], seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline
        time.sleep(0.02)


def metric(service: Service, name: str) -> float:
    with service.client("admin") as admin:
        text = admin.get("/metrics").text
    found = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    assert found is not None, name
    return float(found.group(1))


def test_the_largest_reservation_of_a_subtree_token_is_committed_rolled_back_and_expired(
    tmp_path: Path,
) -> None:
    with serving(tmp_path) as service, service.client("dev") as dev:
        made = [dev.post("/v1/reservations", json={**BODY, "ttl": ttl}) for ttl in (600, 600, 0.2)]
        assert [r.status_code for r in made] == [201, 201, 201]
        first, second, third = (r.json()["id"] for r in made)
        committed = dev.post(f"/v1/reservations/{first}/commit")
        assert committed.status_code == 200, committed.text
        answer = dev.post("/v1/batch", json={"operations": [{"op": "rollback", "id": second}]})
        assert answer.json()["results"][0]["status"] == 200, answer.text
        eventually(lambda: dev.get(f"/v1/reservations/{third}").json()["state"] == "expired")
        assert service.engine.usage(DEEP)["r00"].in_use == 1
        assert service.engine.usage("root")["r00"].reserved == 0
        assert metric(service, "quota_ledger_sweeper_failed_rounds_total") == 0
        with service.client(None) as anyone:
            assert anyone.get("/readyz").json()["status"] == "ready"


def test_an_error_the_service_does_not_map_is_logged_with_its_cause_and_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*_args: Any, **_kwargs: Any) -> Any:
        try:
            raise RuntimeError("the database's own words")
        except RuntimeError as cause:
            raise QuotaLedgerError("database error: RuntimeError") from cause

    with serving(tmp_path) as service, service.client("admin") as admin:
        made = admin.post("/v1/reservations", json={"queue": "root.a", "resources": {"fpga": 1}}).json()
        before = metric(service, "quota_ledger_internal_errors_total")
        monkeypatch.setattr(service.engine, "usage", broken)
        monkeypatch.setattr(service.engine, "decide", broken)
        monkeypatch.setattr(service.engine, "decide_all", lambda ops: [QuotaLedgerError("database error: X")])
        with caplog.at_level(logging.ERROR, logger="quota_ledger.http"):
            answers = [
                admin.get("/v1/queues/root.a/usage"),  # a route
                admin.post(f"/v1/reservations/{made['id']}/commit"),  # the fast lane
            ]
            items = admin.post("/v1/batch", json={"operations": [{"op": "rollback", "id": made["id"]}]})
        for answer in answers:
            assert answer.status_code == 500
            assert answer.json() == {"error": {"code": "internal", "message": "internal error"}}
        assert items.json()["results"] == [
            {"status": 500, "body": {"error": {"code": "internal", "message": "internal error"}}}
        ]
        logged = [r for r in caplog.records if r.name == "quota_ledger.http" and r.levelno == logging.ERROR]
        assert len(logged) == 3
        assert all(r.exc_info is not None for r in logged)
        causes = [r.exc_info[1].__cause__ for r in logged if r.exc_info is not None and r.exc_info[1]]
        assert "the database's own words" in [str(c) for c in causes]
        assert metric(service, "quota_ledger_internal_errors_total") == before + 3


def test_readiness_reports_a_sweeper_that_keeps_failing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with serving(tmp_path, sweep_unready_after=0.3) as service, service.client(None) as anyone:
        assert anyone.get("/readyz").status_code == 200
        expire = service.engine.expire

        def failing(**_kwargs: Any) -> int:
            raise QuotaLedgerError("database error: OperationalError")

        monkeypatch.setattr(service.engine, "expire", failing)
        eventually(lambda: anyone.get("/readyz").status_code == 503)
        unready = anyone.get("/readyz")
        assert unready.headers["retry-after"]
        assert "expiry sweep" in unready.json()["reason"]
        assert "OperationalError" not in unready.text  # the log has it; this answer needs no token
        assert metric(service, "quota_ledger_sweeper_failed_rounds_total") >= 1
        assert metric(service, "quota_ledger_sweeper_failing_seconds") > 0.3
        monkeypatch.setattr(service.engine, "expire", expire)
        eventually(lambda: anyone.get("/readyz").status_code == 200)
        assert metric(service, "quota_ledger_sweeper_failing_seconds") == 0
        assert metric(service, "quota_ledger_sweeper_set_aside") == 0
