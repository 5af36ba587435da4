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

from quota_ledger.cli import help_text, output
from quota_ledger.cli.exit_codes import EXIT_ERROR, EXIT_USAGE

if TYPE_CHECKING:
    from quota_ledger.cli.parser import SharedOptions, Subcommands
    from quota_ledger.engine import QuotaEngine
    from quota_ledger.runtime.settings import Settings

#: the roles of ``tokens add --role``; quota_ledger.runtime.tokens.ROLES, which a test holds them to
#: (that module opens the database: importing it would slow every command's start)
ROLES = ("reader", "service", "admin", "admission")


def register(sub: Subcommands, options: SharedOptions) -> None:
    """Add ``serve`` and ``tokens`` with its actions."""
    common = options.common
    p = help_text.add_command(
        sub,
        "serve",
        parents=[common],
        help="run the HTTP service (and the expiry sweeper)",
        description="Run the HTTP service (API, dashboard at /ui, docs at /docs) and the expiry sweeper, "
        "after upgrading the schema; a SQLite ledger that does not exist yet is created.",
        examples=[
            "quota-ledger serve --port 8080",
            "quota-ledger --db postgresql://ledger@db.example/quota serve --host 0.0.0.0 --workers 4 "
            "--tls-certfile cert.pem --tls-keyfile key.pem",
        ],
        exits={
            EXIT_ERROR: "an error, or QUOTA_LEDGER_TLS_CLIENT_CA without a TLS certificate and key",
            EXIT_USAGE: "bad usage, or --tls-certfile without --tls-keyfile, or --workers without --port",
        },
    )
    p.add_argument("--host", help="listen address (env QUOTA_LEDGER_HOST, default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (env QUOTA_LEDGER_PORT, default 8080; 0 = any free port)")
    p.add_argument("--tls-certfile", metavar="FILE", help="serve HTTPS with this PEM certificate")
    p.add_argument("--tls-keyfile", metavar="FILE", help="and this PEM private key")
    p.add_argument("--no-migrate", action="store_true", help="do not upgrade the schema at start")
    p.add_argument("--no-sweep", action="store_true", help="do not run the expiry sweeper")
    p.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="worker processes (env QUOTA_LEDGER_WORKERS, default 1; each sweeps)",
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
        metavar="N",
        help="requests one batched transaction decides at most (env QUOTA_LEDGER_MAX_BATCH, default 256)",
    )
    p.add_argument(
        "--access-log",
        choices=("text", "json", "off"),
        help="a line a request on stderr: text, json (lines) or off (env QUOTA_LEDGER_ACCESS_LOG; text)",
    )
    p.set_defaults(handler=_serve, local_only=True, creates_ledger=True)
    tok = help_text.add_group(sub, "tokens", help="bearer tokens of the HTTP service")
    p = help_text.add_command(
        tok,
        "add",
        parents=[common],
        help="create token NAME; prints it once",
        description="Create a bearer token and print it, the only time it is shown (the ledger keeps "
        "its hash). Give it to a client in a file: quota-ledger --token-file FILE.",
        examples=[
            "quota-ledger tokens add ci --role service > ci.token",
            "quota-ledger tokens add team1-view --role reader --queue root.dev.team1 --replace",
        ],
    )
    p.add_argument("name", help="the token's name: 1-64 of A-Z a-z 0-9 _ . - (a letter or digit first)")
    p.add_argument(
        "--role",
        required=True,
        choices=ROLES,
        help="reader: reads; service: reserves and releases too; admin: everything; admission: "
        "the Kubernetes admission webhook only",
    )
    p.add_argument("--partition", metavar="P", help="restrict the token to this partition")
    p.add_argument("--queue", metavar="Q", help="restrict the token to this queue's subtree")
    p.add_argument(
        "--replace",
        action="store_true",
        help="replace the token of that name, if any (its old value stops working)",
    )
    p.set_defaults(handler=_tokens_add, local_only=True)
    help_text.add_command(
        tok,
        "list",
        parents=[common],
        help="list tokens (never their values)",
        examples=["quota-ledger tokens list", "quota-ledger tokens list --json"],
    ).set_defaults(handler=_tokens_list, local_only=True)
    p = help_text.add_command(
        tok,
        "revoke",
        parents=[common],
        help="revoke token NAME",
        description="Revoke a token: it stops working at once (within token_cache_seconds on a running "
        "service).",
        examples=[
            "quota-ledger tokens revoke ci",
            "quota-ledger --db postgresql://ledger@db.example/quota tokens revoke ci",
        ],
    )
    p.add_argument("name", help="the token's name")
    p.set_defaults(handler=_tokens_revoke, local_only=True)


def _serve(engine: QuotaEngine, args: argparse.Namespace, settings: Settings) -> int:
    import uvicorn

    from quota_ledger.engine import QuotaEngine
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
    settings.check_serving()  # UnusableSetting: exit 1, as every ledger error
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
    from quota_ledger.runtime import tokens

    token = tokens.add(
        engine, args.name, args.role, partition=args.partition, queue=args.queue, replace=args.replace
    )
    print(token)
    print(f"# token {args.name!r} ({args.role}); it is shown only now", file=sys.stderr)
    return 0


def _tokens_list(engine: QuotaEngine, args: argparse.Namespace, _s: Settings) -> int:
    from quota_ledger.runtime import tokens

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
    from quota_ledger.runtime import tokens

    tokens.revoke(engine, args.name)
    print(f"revoked token {args.name}")
    return 0
