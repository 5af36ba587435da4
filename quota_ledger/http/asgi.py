"""``quota_ledger.http.asgi:create`` — the app factory uvicorn imports in each worker process
(``quota-ledger serve --workers N``). Settings come from the environment (``QUOTA_LEDGER_*``)."""

from __future__ import annotations

import os

from fastapi import FastAPI

from quota_ledger.engine import QuotaEngine
from quota_ledger.http import access_log, protocol
from quota_ledger.http.app import create_app
from quota_ledger.runtime.settings import Settings


def create() -> FastAPI:
    settings = Settings(_env_file=os.environ.get("QUOTA_LEDGER_SETTINGS_FILE"))  # type: ignore[call-arg]
    access_log.configure(settings.access_log, verbose=os.environ.get("QUOTA_LEDGER_VERBOSE") == "1")
    protocol.BoundedHttp.configure(settings)
    engine = QuotaEngine.from_url(settings.db_urls, **settings.engine_options())
    return create_app(engine, settings, sweep=os.environ.get("QUOTA_LEDGER_NO_SWEEP") != "1")
