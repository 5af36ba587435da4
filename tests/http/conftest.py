"""A real uvicorn server on a free loopback port, on a fresh PostgreSQL database per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import uvicorn
from http_support import Service, in_thread
from sqlalchemy.engine import URL

from quota_ledger import QuotaEngine
from quota_ledger.http.app import create_app
from quota_ledger.runtime import tokens
from quota_ledger.runtime.settings import Settings


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
    try:
        with in_thread(config) as port:
            yield Service(f"http://127.0.0.1:{port}", engine, issued)
    finally:
        engine.close()
