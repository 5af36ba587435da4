"""The FastAPI application: routes, error handlers, the 1 MiB body limit and the sweeper."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from fastapi import FastAPI

from quota_ledger.engine import QuotaEngine
from quota_ledger.http import admission, batch, docs, errors, ledger_ops, login, ops, routes, ui, yunikorn
from quota_ledger.http.access_log import AccessLog
from quota_ledger.http.auth import Authenticator
from quota_ledger.http.browser import Sessions
from quota_ledger.http.fast_lane import FastLane
from quota_ledger.http.metrics import Metrics
from quota_ledger.runtime import sweeper
from quota_ledger.runtime.settings import Settings

if TYPE_CHECKING:
    from quota_ledger.openstack.sync import KeystoneSync

MAX_BODY = 1024 * 1024

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class BodyLimit:
    """Refuse request bodies over ``limit`` bytes (413), whether announced or streamed."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]], limit: int = MAX_BODY) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            await _too_large(send)
            return
        seen = 0
        refused = False

        async def limited() -> Message:
            nonlocal seen, refused
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    refused = True
                    raise _TooLarge
            return message

        try:
            await self.app(scope, limited, send)
        except _TooLarge:
            await _too_large(send)


class _TooLarge(Exception):
    pass


class RelativeRedirects:
    """Send redirects (the router's own, from ``/path/`` to ``/path``) as a path, never with the
    scheme and host they were built from: those come from the request's ``Host`` header, which
    the client chose."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def relative(message: Message) -> None:
            if message["type"] == "http.response.start" and 300 <= message["status"] < 400:
                message["headers"] = [
                    (name, _path_of(value) if name.lower() == b"location" else value)
                    for name, value in message.get("headers", [])
                ]
            await send(message)

        await self.app(scope, receive, relative)


def _path_of(location: bytes) -> bytes:
    parts = urlsplit(location.decode("latin-1"))
    path = "/" + parts.path.lstrip("/")  # never "//host/...", which a browser reads as a host
    return (path + (f"?{parts.query}" if parts.query else "")).encode("latin-1")


async def _too_large(send: Send) -> None:
    body = b'{"error":{"code":"too_large","message":"request body over 1 MiB"}}'
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


def create_app(engine: QuotaEngine, settings: Settings, *, sweep: bool = True) -> FastAPI:
    health = sweeper.Health() if sweep else None
    metrics = Metrics(engine, health)
    sessions = Sessions(max_age=settings.session_max_age, tls_at_proxy=settings.tls_at_proxy)
    auth = Authenticator(engine, settings.token_cache_seconds, sessions)
    stop = threading.Event()
    keystone = keystone_sync(engine, settings)
    if keystone is not None:
        metrics.watch_keystone(keystone)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        thread = None
        if sweep:

            def loop() -> None:
                def counted(expired: int) -> None:
                    metrics.sweeper_batches.inc()
                    metrics.sweeper_rows.inc(expired)

                sweeper.run(
                    engine,
                    interval=settings.sweep_interval,
                    batch_size=settings.sweep_batch_size,
                    max_rate=settings.sweep_max_rate,
                    stop=stop,
                    on_round=counted,
                    health=health,
                )

            thread = threading.Thread(target=loop, name="quota-ledger-sweeper", daemon=True)
            thread.start()
        syncing = None
        if keystone is not None and settings.openstack_sync_interval is not None:
            every = settings.openstack_sync_interval
            syncing = threading.Thread(
                target=keystone.run,
                args=(stop,),
                kwargs={"every": every},
                name="quota-ledger-keystone",
                daemon=True,
            )
            syncing.start()
        try:
            yield
        finally:
            stop.set()
            for running in (thread, syncing):
                if running is not None:
                    running.join(timeout=10)

    app = FastAPI(
        title="quota-ledger",
        version="0.1.0",
        description="Reserve resources against queue, user, group and Kubernetes ResourceQuota limits, "
        "then commit or roll back.",
        lifespan=lifespan,
        # The document and the docs page need a token too (only /healthz and /readyz do not).
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
    )
    errors.install(app)
    app.include_router(
        ops.build(engine, auth, metrics, sweep=health, unready_after=settings.sweep_unready_after)
    )
    app.include_router(routes.build(engine, auth, metrics))
    app.include_router(batch.build(auth, ledger_ops.LedgerOps(engine, metrics)))
    app.include_router(yunikorn.build(engine, auth))
    app.include_router(admission.build(engine, auth, settings, metrics))
    app.include_router(login.build(auth))
    app.include_router(ui.build(engine, auth))
    app.include_router(docs.build(app, auth))
    app.add_middleware(FastLane, auth=auth, ops=ledger_ops.LedgerOps(engine, metrics))
    app.add_middleware(BodyLimit)
    app.add_middleware(RelativeRedirects)
    if settings.access_log != "off":
        app.add_middleware(AccessLog, fmt=settings.access_log)  # outermost: sees every answer, 413 too
    app.state.engine = engine
    app.state.metrics = metrics
    #: the Keystone sync the service runs (``ensure_project`` for the enforcer), or None
    app.state.keystone_sync = keystone
    return app


def keystone_sync(engine: QuotaEngine, settings: Settings) -> KeystoneSync | None:
    """The Keystone sync ``settings`` ask the service to run (``openstack_sync_interval``), or
    None. Its credentials are read when it first syncs, so a service whose cloud is not usable yet
    starts, logs why each sync fails and reports the limits' age as not known."""
    if settings.openstack_sync_interval is None:
        return None
    from quota_ledger.openstack import keystone, sync, unified_limits

    options = sync.SyncOptions(
        services=tuple(s.strip() for s in settings.openstack_services.split(",") if s.strip()),
        region=settings.openstack_region,
        missing=unified_limits.MissingRegistered(settings.openstack_missing_registered),
    )
    return sync.KeystoneSync(engine, keystone.LazyReader(settings.openstack_cloud), options)
