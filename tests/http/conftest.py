"""A real uvicorn server on a free loopback port, on a fresh PostgreSQL database per test."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn
from http_support import Service
from sqlalchemy.engine import URL

from quota_ledger import QuotaEngine
from quota_ledger.http.app import create_app
from quota_ledger.service import tokens
from quota_ledger.service.settings import Settings


@pytest.fixture
def service(request: pytest.FixtureRequest, postgres_url: URL) -> Iterator[Service]:
    """The service on its own engine; ``indirect`` parametrization passes engine options
    (``{"batching": True}``) and ``token_cache_seconds`` (0 unless given)."""
    options = dict(getattr(request, "param", {}))
    cache_seconds = options.pop("token_cache_seconds", 0.0)
    engine = QuotaEngine.from_url(postgres_url, pool_size=20, **options)
    engine.migrate()
    issued = {role: tokens.add(engine, f"test-{role}", role) for role in tokens.ROLES}
    issued["team-a"] = tokens.add(engine, "team-a", "service", partition="default", queue="root.a")
    settings = Settings(db="sqlite://", token_cache_seconds=cache_seconds, sweep_interval=0.2)  # type: ignore[call-arg]
    app = create_app(engine, settings)
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield Service(f"http://127.0.0.1:{port}", engine, issued)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        engine.close()
