"""When the database is down: 503 with Retry-After, readiness says so, liveness does not."""

from __future__ import annotations

import httpx
import uvicorn
from http_support import in_thread

from quota_ledger import QuotaEngine
from quota_ledger.http.app import create_app
from quota_ledger.runtime.settings import Settings


def test_a_dead_database_gives_503_with_retry_after() -> None:
    # Nothing listens on port 1: every connection attempt fails at once.
    engine = QuotaEngine.from_url("postgresql://nobody@127.0.0.1:1/none")
    engine.driver.max_attempts = 2
    engine.driver.backoff_base = 0.001
    app = create_app(engine, Settings(db="sqlite://"), sweep=False)  # type: ignore[call-arg]
    try:
        with in_thread(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="error")) as port:
            base = f"http://127.0.0.1:{port}"
            with httpx.Client(base_url=base, timeout=30) as client:
                assert client.get("/healthz").status_code == 200
                ready = client.get("/readyz")
                assert ready.status_code == 503
                assert ready.headers["retry-after"]
                refused = client.post(
                    "/v1/reservations",
                    json={"queue": "root.a", "resources": {"fpga": 1}},
                    headers={"Authorization": "Bearer qlt_anything"},
                )
                assert refused.status_code == 503
                assert refused.headers["retry-after"] == "1"
                assert refused.json()["error"]["code"] == "database_unavailable"
                assert "127.0.0.1:1" not in refused.text  # no connection details leak
    finally:
        engine.close()
