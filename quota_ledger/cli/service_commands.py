"""The HTTP service's commands: ``serve`` and ``tokens add|list|revoke``. Both work on the
database itself, never through ``--url``.

uvicorn and the FastAPI app are imported when ``serve`` runs, not with this module: every other
command starts without them."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import threading
from typing import TYPE_CHECKING, Any

from quota_ledger.cli import output
from quota_ledger.engine import QuotaEngine
from quota_ledger.service import tokens
from quota_ledger.service.settings import Settings

if TYPE_CHECKING:
    from quota_ledger.cli.parser import SharedOptions, Subcommands


def register(sub: Subcommands, options: SharedOptions) -> None:
    """Add ``serve`` and ``tokens`` with its actions."""
    common = options.common
    p = sub.add_parser("serve", parents=[common], help="run the HTTP service (and the expiry sweeper)")
    p.add_argument("--host", help="listen address (env QUOTA_LEDGER_HOST, default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (env QUOTA_LEDGER_PORT, default 8080; 0 = any free port)")
    p.add_argument("--tls-certfile", help="serve HTTPS with this PEM certificate")
    p.add_argument("--tls-keyfile", help="and this PEM private key")
    p.add_argument("--no-migrate", action="store_true", help="do not upgrade the schema at start")
    p.add_argument("--no-sweep", action="store_true", help="do not run the expiry sweeper")
    p.add_argument(
        "--workers", type=int, help="worker processes (env QUOTA_LEDGER_WORKERS, default 1; each sweeps)"
    )
    p.add_argument(
        "--batching",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="decide concurrent reservations, commits and rollbacks many per transaction "
        "(env QUOTA_LEDGER_BATCHING, default on)",
    )
    p.add_argument(
        "--max-batch",
        type=int,
        help="requests one batched transaction decides at most (env QUOTA_LEDGER_MAX_BATCH, default 256)",
    )
    p.add_argument(
        "--access-log",
        choices=("text", "json", "off"),
        help="a line a request on stderr: text, json (lines) or off (env QUOTA_LEDGER_ACCESS_LOG; text)",
    )
    p.set_defaults(handler=_serve, local_only=True, creates_ledger=True)
    tok = sub.add_parser("tokens", help="bearer tokens of the HTTP service").add_subparsers(
        title="tokens commands", metavar="ACTION"
    )
    p = tok.add_parser("add", parents=[common], help="create token NAME; prints it once")
    p.add_argument("name")
    p.add_argument("--role", required=True, choices=tokens.ROLES)
    p.add_argument("--partition", help="restrict the token to this partition")
    p.add_argument("--queue", help="restrict the token to this queue's subtree")
    p.add_argument(
        "--replace",
        action="store_true",
        help="replace the token of that name, if any (its old value stops working)",
    )
    p.set_defaults(handler=_tokens_add, local_only=True)
    tok.add_parser("list", parents=[common], help="list tokens (never their values)").set_defaults(
        handler=_tokens_list, local_only=True
    )
    p = tok.add_parser("revoke", parents=[common], help="revoke token NAME")
    p.add_argument("name")
    p.set_defaults(handler=_tokens_revoke, local_only=True)


def _serve(engine: QuotaEngine, args: argparse.Namespace, settings: Settings) -> int:
    import uvicorn

    from quota_ledger.http import access_log, protocol
    from quota_ledger.http.app import create_app

    overrides = {
        key: value
        for key, value in (
            ("host", args.host),
            ("port", args.port),
            ("tls_certfile", args.tls_certfile),
            ("tls_keyfile", args.tls_keyfile),
            ("access_log", args.access_log),
            ("batching", args.batching),
            ("max_batch", args.max_batch),
        )
        if value is not None
    }
    settings = settings.model_copy(update=overrides)
    if bool(settings.tls_certfile) != bool(settings.tls_keyfile):
        print("error: --tls-certfile and --tls-keyfile go together", file=sys.stderr)
        return 2
    access_log.configure(settings.access_log, verbose=bool(args.verbose))
    served = QuotaEngine.from_url(settings.db_urls, **settings.engine_options())
    if not args.no_migrate:
        served.migrate()
    scheme = "https" if settings.tls_certfile else "http"
    workers = args.workers if args.workers is not None else settings.workers
    if workers > 1:
        served.close()
        return _serve_workers(settings, workers, scheme, no_sweep=args.no_sweep, verbose=bool(args.verbose))
    app = create_app(served, settings, sweep=not args.no_sweep)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        http=protocol.bounded(settings),
        **protocol.uvicorn_options(settings),
        ssl_certfile=settings.tls_certfile,
        ssl_keyfile=settings.tls_keyfile,
        log_level="info" if args.verbose else "warning",
        access_log=False,  # ours (quota_ledger.access) names the token and times the request
    )
    server = uvicorn.Server(config)

    def announce() -> None:
        for listener in server.servers:
            for sock in listener.sockets:
                host, port = sock.getsockname()[:2]
                print(
                    f"quota-ledger serving on {scheme}://{host}:{port}  (dashboard: /ui, API: /docs)",
                    flush=True,
                )

    original = server.startup

    async def startup(sockets: Any = None) -> None:
        await original(sockets)
        announce()

    server.startup = startup  # type: ignore[method-assign]
    try:
        server.run()
    finally:
        served.close()
    return 0


def _serve_workers(settings: Settings, workers: int, scheme: str, *, no_sweep: bool, verbose: bool) -> int:
    """Several processes behind one socket; each builds its app from the environment."""
    import os

    import uvicorn

    from quota_ledger.http import protocol

    if settings.port == 0:
        print("error: --workers needs an explicit --port", file=sys.stderr)
        return 2
    os.environ.update(
        {
            f"QUOTA_LEDGER_{name.upper()}": str(value)
            for name, value in settings.model_dump().items()
            if value is not None
        }
    )
    if no_sweep:
        os.environ["QUOTA_LEDGER_NO_SWEEP"] = "1"
    if verbose:
        os.environ["QUOTA_LEDGER_VERBOSE"] = "1"
    announcement = (
        f"quota-ledger serving on {scheme}://{settings.host}:{settings.port}  ({workers} workers; "
        "dashboard: /ui, API: /docs)"
    )
    threading.Thread(
        target=_announce_when_up, args=(scheme, settings.host, settings.port, announcement), daemon=True
    ).start()
    uvicorn.run(
        "quota_ledger.http.asgi:create",
        factory=True,
        host=settings.host,
        port=settings.port,
        workers=workers,
        http="quota_ledger.http.protocol:BoundedHttp",  # its bounds: set by each worker's app factory
        **protocol.uvicorn_options(settings),
        ssl_certfile=settings.tls_certfile,
        ssl_keyfile=settings.tls_keyfile,
        log_level="info" if verbose else "warning",
        access_log=False,
    )
    return 0


def _announce_when_up(scheme: str, host: str, port: int, announcement: str) -> None:
    """Print the announcement once a worker answers /healthz (workers start after the parent)."""
    import ssl
    import time
    import urllib.request

    context = ssl._create_unverified_context() if scheme == "https" else None  # noqa: S323 - a local probe
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"{scheme}://{host}:{port}/healthz", timeout=1, context=context)  # noqa: S310
        except OSError:
            time.sleep(0.1)
            continue
        print(announcement, flush=True)
        return


def _tokens_add(engine: QuotaEngine, args: argparse.Namespace, _s: Settings) -> int:
    token = tokens.add(
        engine, args.name, args.role, partition=args.partition, queue=args.queue, replace=args.replace
    )
    print(token)
    print(f"# token {args.name!r} ({args.role}); it is shown only now", file=sys.stderr)
    return 0


def _tokens_list(engine: QuotaEngine, args: argparse.Namespace, _s: Settings) -> int:
    found = tokens.listing(engine)
    if args.json:
        import json

        print(json.dumps([dataclasses.asdict(t) for t in found], default=str, indent=2))
        return 0
    print(output.tokens_table(found))
    if not found:
        print("# no tokens yet: quota-ledger tokens add NAME --role ROLE", file=sys.stderr)
    return 0


def _tokens_revoke(engine: QuotaEngine, args: argparse.Namespace, _s: Settings) -> int:
    tokens.revoke(engine, args.name)
    print(f"revoked token {args.name}")
    return 0
