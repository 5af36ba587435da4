"""The ``quota-ledger`` command. Exit codes: 0 ok, 1 ledger error, 2 bad usage, 3 over quota,
4 audit found drift (without ``--fix``)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from datetime import datetime
from enum import Enum
from typing import Any, cast

import yaml

from quota_ledger.cli import config as cli_config
from quota_ledger.cli import output as cli_output
from quota_ledger.cli import progress as cli_progress
from quota_ledger.cli import service as cli_service
from quota_ledger.cli import views as cli_views
from quota_ledger.cli.output import table as _table
from quota_ledger.cli.remote import RemoteEngine
from quota_ledger.driver import migrate
from quota_ledger.engine import QuotaEngine
from quota_ledger.model.errors import ConfigError, InvalidRequest, OverQuota, QuotaLedgerError
from quota_ledger.model.values import Reservation
from quota_ledger.service import location, sweeper
from quota_ledger.service.settings import Settings

EXIT_ERROR, EXIT_USAGE, EXIT_OVER_QUOTA, EXIT_DRIFT = 1, 2, 3, 4


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    # Global options may come before or after the command; parents share their actions, so
    # their defaults are filled in here rather than with set_defaults.
    for name, default in (
        ("db", None),
        ("json", False),
        ("verbose", False),
        ("settings", None),
        ("url", None),
        ("token", None),
    ):
        if not hasattr(args, name):
            setattr(args, name, default)
    if not hasattr(args, "handler"):
        parser.print_help()
        return EXIT_USAGE
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    logging.getLogger("quota_ledger.summary").setLevel(logging.INFO)  # a finished application's line
    settings_file = getattr(args, "settings", None) or os.environ.get("QUOTA_LEDGER_SETTINGS_FILE")
    overrides: dict[str, Any] = {} if args.db is None else {"db": args.db}
    settings = Settings(_env_file=settings_file, **overrides)  # type: ignore[call-arg]
    url = args.url or os.environ.get("QUOTA_LEDGER_URL")
    if url and args.handler in _local_only():
        print("error: this command works on the database (--db), not through --url", file=sys.stderr)
        return EXIT_USAGE
    try:
        engine = _open(args, settings, url)
    except QuotaLedgerError as error:
        _fail(args, error)
        return EXIT_ERROR
    try:
        handler: Callable[[QuotaEngine, argparse.Namespace, Settings], int] = args.handler
        return handler(engine, args, settings)
    except OverQuota as error:
        _fail(args, error, violations=[dataclasses.asdict(v) for v in error.violations])
        return EXIT_OVER_QUOTA
    except ConfigError as error:
        if args.json:
            _fail(args, error, problems=[dataclasses.asdict(p) for p in error.problems])
        else:  # each problem once: the list, not also the message that joins them
            count = len(error.problems)
            print(f"error: invalid configuration ({count} problem{'s' * (count != 1)}):", file=sys.stderr)
            for problem in error.problems:
                print(f"  - {problem.describe()}", file=sys.stderr)
        return EXIT_ERROR
    except QuotaLedgerError as error:
        _fail(args, error)
        return EXIT_ERROR
    finally:
        engine.close()


def _open(args: argparse.Namespace, settings: Settings, url: str | None) -> QuotaEngine:
    if url:
        # The service client has the engine's methods and raises the engine's errors.
        return cast(QuotaEngine, RemoteEngine(url, args.token or os.environ.get("QUOTA_LEDGER_TOKEN")))
    if args.handler in _creating():
        location.prepare(settings.db)
    else:
        location.require_existing(settings.db)  # else SQLite would leave an empty file behind
    return QuotaEngine.from_url(settings.db, **settings.engine_options())


# -- commands ------------------------------------------------------------------------------------
def _local_only() -> set[Any]:
    return {_db_upgrade, _db_downgrade, _db_current, _sweep, *cli_service.LOCAL_ONLY}


def _creating() -> set[Any]:
    """Commands that may create the ledger: those that migrate it."""
    return {_db_upgrade, *cli_service.CREATING}


def _db_upgrade(engine: QuotaEngine, args: argparse.Namespace, settings: Settings) -> int:
    engine.migrate(args.revision)
    return _db_current(engine, args, settings)


def _db_downgrade(engine: QuotaEngine, args: argparse.Namespace, settings: Settings) -> int:
    with engine.driver.translated():
        migrate.downgrade(engine.driver.engine, args.revision)
    return _db_current(engine, args, settings)


def _db_current(engine: QuotaEngine, args: argparse.Namespace, settings: Settings) -> int:
    with engine.driver.translated():
        revision = migrate.current(engine.driver.engine)
    where = {"revision": revision, "database": location.describe(settings.db)}
    _say(args, where, "schema at {revision} in {database}")
    return 0


def _limits_set(engine: QuotaEngine, args: argparse.Namespace, _s: Settings) -> int:
    engine.set_limits(args.queue, _pairs(args.resources, allow_none=True), partition=args.partition)
    return _limits_show(engine, args, _s)


def _limits_show(engine: QuotaEngine, args: argparse.Namespace, _s: Settings) -> int:
    limits = engine.limits(partition=args.partition)
    if getattr(args, "queue", None):
        limits = {q: v for q, v in limits.items() if q == args.queue}
    if args.json:
        _emit(limits)
        return 0
    rows = [
        [q, res, cli_output.human(res, lim), str(lim)] for q, v in limits.items() for res, lim in v.items()
    ]
    print(_table(["QUEUE", "RESOURCE", "LIMIT", "BASE UNITS"], rows) if rows else "no limits set")
    return 0


def _reserve(engine: QuotaEngine, args: argparse.Namespace, _s: Settings) -> int:
    reservation = engine.reserve(
        args.queue,
        _pairs(args.resources),
        partition=args.partition,
        user=args.user,
        groups=args.group or (),
        application=args.application,
        priority_class=args.priority_class,
        ttl=args.ttl,
        key=args.key,
    )
    return _print_reservation(args, reservation)


def _commit(engine: QuotaEngine, args: argparse.Namespace, _s: Settings) -> int:
    partial = _pairs(args.resources) if args.resources else None
    return _print_reservation(args, engine.commit(cli_views.full_id(engine, args.id), partial))


def _rollback(engine: QuotaEngine, args: argparse.Namespace, _s: Settings) -> int:
    return _print_reservation(args, engine.rollback(cli_views.full_id(engine, args.id)))


def _show(engine: QuotaEngine, args: argparse.Namespace, _s: Settings) -> int:
    return _print_reservation(args, engine.get(cli_views.full_id(engine, args.id)))


def _release(engine: QuotaEngine, args: argparse.Namespace, _s: Settings) -> int:
    resources = _pairs(args.resources)
    engine.release(
        args.queue,
        resources,
        partition=args.partition,
        user=args.user,
        groups=args.group or (),
        application=args.application,
        finished=args.finished,
    )
    _say(args, {"released": resources, "queue": args.queue}, "released from {queue}")
    return 0


def _usage(engine: QuotaEngine, args: argparse.Namespace, _s: Settings) -> int:
    if args.queue is None:
        return _usage_tree(engine, args)
    usage = engine.usage(args.queue, partition=args.partition)
    if args.json:
        _emit({res: {**dataclasses.asdict(u), "available": u.available} for res, u in usage.items()})
        return 0
    print(f"usage of {args.queue} (partition {args.partition}, whole subtree)")
    print(cli_output.usage_table(usage) if usage else "no usage recorded")
    return 0


def _usage_tree(engine: QuotaEngine, args: argparse.Namespace) -> int:
    tree = cli_views.queue_tree(engine, args.partition)
    if args.json:
        _emit(
            {
                q: {res: {**dataclasses.asdict(u), "available": u.available} for res, u in usage.items()}
                for q, usage in tree.items()
            }
        )
        return 0
    print(f"queues of partition {args.partition} (usage of each whole subtree, the queue's own limit)")
    print(cli_output.usage_tree(tree) if tree else "no usage or limits recorded")
    return 0


def _sweep(engine: QuotaEngine, args: argparse.Namespace, settings: Settings) -> int:
    batch = args.batch_size or settings.sweep_batch_size
    rate = settings.sweep_max_rate if args.max_rate is None else args.max_rate
    if args.once:
        expired = cli_views.expire_backlog(engine, batch, args.workers, rate)
        _say(args, {"expired": expired}, "expired {expired} reservations")
        return 0
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    interval = args.interval or settings.sweep_interval
    pace = f", at most {rate:g}/s" if rate else ""
    print(f"sweeping every {interval}s in batches of {batch}{pace}; Ctrl-C to stop", file=sys.stderr)
    total = sweeper.run(
        engine,
        interval=interval,
        batch_size=batch,
        workers=args.workers,
        max_rate=rate,
        stop=stop,
        on_round=lambda n: print(f"expired {n} reservations", file=sys.stderr, flush=True) if n else None,
    )
    _say(args, {"expired": total}, "stopped; expired {expired} reservations in total")
    return 0


def _audit(engine: QuotaEngine, args: argparse.Namespace, _s: Settings) -> int:
    drifts = cli_views.audit(engine, fix=args.fix, partition=args.partition)
    if args.json:
        _emit([dataclasses.asdict(d) for d in drifts])
    elif not drifts:
        print("audit clean: every counter matches the ledger history")
    else:
        print(cli_output.drift_table(drifts))
    return EXIT_DRIFT if drifts and not args.fix else 0


def _config_apply(engine: QuotaEngine, args: argparse.Namespace, _s: Settings) -> int:
    source = cli_config.read_source(args.file)
    before = engine.config_version()
    with cli_progress.bar(f"applying {args.file}", None):
        version = engine.apply_config(source, allow_removing_all=args.allow_removing_all)
    if version == before:
        _say(args, {"version": version}, "configuration unchanged: version {version} stays in force")
    else:
        _say(args, {"version": version}, "applied configuration version {version}")
    return 0


def _config_validate(engine: QuotaEngine, args: argparse.Namespace, _s: Settings) -> int:
    problems = engine.validate_config(cli_config.read_source(args.file))
    if args.json:
        _emit([dataclasses.asdict(p) for p in problems])
    elif not problems:
        print("configuration is valid")
    for problem in [] if args.json else problems:
        print(f"- {problem.describe()}")
    return EXIT_ERROR if problems else 0


def _config_show(engine: QuotaEngine, args: argparse.Namespace, _s: Settings) -> int:
    document = engine.config()
    if args.json:
        _emit({"version": engine.config_version(), "config": document})
    else:
        print(yaml.safe_dump(document, sort_keys=False), end="")
    return 0


def _users(engine: QuotaEngine, args: argparse.Namespace, _s: Settings) -> int:
    if args.name:
        return _identities(args, "user", [engine.user_usage(args.name, partition=args.partition)])
    return _identities(args, "user", engine.user_usages(partition=args.partition))


def _groups(engine: QuotaEngine, args: argparse.Namespace, _s: Settings) -> int:
    if args.name:
        return _identities(args, "group", [engine.group_usage(args.name, partition=args.partition)])
    return _identities(args, "group", engine.group_usages(partition=args.partition))


def _identities(args: argparse.Namespace, kind: str, found: list[dict[str, Any]]) -> int:
    if args.json:
        _emit(found[0] if args.name else found)  # YuniKorn's REST shape
    else:
        print(cli_output.identity_table(kind, found))
    return 0


def _app_summary(engine: QuotaEngine, args: argparse.Namespace, _s: Settings) -> int:
    _emit(engine.application_summary(args.application, partition=args.partition))
    return 0


def _namespace_apply(engine: QuotaEngine, args: argparse.Namespace, _s: Settings) -> int:
    queue = engine.apply_namespace(cli_config.read_source(args.file), partition=args.partition)
    _say(args, {"queue": queue}, "namespace placed on {queue}")
    return 0


def _quota_apply(engine: QuotaEngine, args: argparse.Namespace, _s: Settings) -> int:
    status = engine.apply_resource_quota(cli_config.read_source(args.file), partition=args.partition)
    _emit(status)
    return 0


def _quota_delete(engine: QuotaEngine, args: argparse.Namespace, _s: Settings) -> int:
    engine.delete_resource_quota(args.namespace, args.name, partition=args.partition)
    _say(args, {"quota": f"{args.namespace}/{args.name}"}, "deleted resourcequota {quota}")
    return 0


def _quota_status(engine: QuotaEngine, args: argparse.Namespace, _s: Settings) -> int:
    _emit(engine.resource_quota_status(args.namespace, args.name, partition=args.partition))
    return 0


def _admission_apply(engine: QuotaEngine, args: argparse.Namespace, _s: Settings) -> int:
    engine.apply_admission_config(cli_config.read_source(args.file), partition=args.partition)
    _say(args, {"file": args.file}, "admission configuration applied from {file}")
    return 0


def _pod_reserve(engine: QuotaEngine, args: argparse.Namespace, _s: Settings) -> int:
    manifest = cli_config.read_source(args.file)
    made = engine.reserve_pod(manifest, partition=args.partition, ttl=args.ttl, key=args.key)
    return _print_reservation(args, made)


def _pod_release(engine: QuotaEngine, args: argparse.Namespace, _s: Settings) -> int:
    done = engine.release_pod(
        cli_config.read_source(args.file), partition=args.partition, key=args.key, finished=args.finished
    )
    return _print_reservation(args, done)


# -- parsing and printing ------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--db",
        default=argparse.SUPPRESS,
        help=f"database URL (env QUOTA_LEDGER_DB; default: the SQLite file {location.default_file()})",
    )
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON")
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS)
    common.add_argument(
        "--url", default=argparse.SUPPRESS, help="talk to a running service instead (env QUOTA_LEDGER_URL)"
    )
    common.add_argument(
        "--token", default=argparse.SUPPRESS, help="bearer token for --url (env QUOTA_LEDGER_TOKEN)"
    )
    common.add_argument(
        "--settings",
        default=argparse.SUPPRESS,
        help="settings file of QUOTA_LEDGER_*=value lines (env QUOTA_LEDGER_SETTINGS_FILE)",
    )
    part = argparse.ArgumentParser(add_help=False)
    part.add_argument("--partition", default="default")
    ident = argparse.ArgumentParser(add_help=False)
    ident.add_argument("--user")
    ident.add_argument("--group", action="append", help="a group of the user (repeatable)")
    ident.add_argument("--application")

    parser = argparse.ArgumentParser(
        prog="quota-ledger", parents=[common], description="A database-backed quota ledger."
    )
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")

    db = sub.add_parser("db", help="schema migrations").add_subparsers(title="db commands", metavar="ACTION")
    p = db.add_parser("upgrade", parents=[common], help="migrate to the newest schema (or --revision)")
    p.add_argument("--revision", default="head")
    p.set_defaults(handler=_db_upgrade)
    p = db.add_parser("downgrade", parents=[common], help="migrate down to REVISION (base = drop all)")
    p.add_argument("revision")
    p.set_defaults(handler=_db_downgrade)
    db.add_parser("current", parents=[common], help="print the schema revision").set_defaults(
        handler=_db_current
    )

    limits = sub.add_parser("limits", help="queue limits").add_subparsers(
        title="limits commands", metavar="ACTION"
    )
    p = limits.add_parser(
        "set", parents=[common, part], help="set limits: QUEUE RES=QTY ... (RES=none removes)"
    )
    p.add_argument("queue")
    p.add_argument("resources", nargs="+", metavar="RES=QTY")
    p.set_defaults(handler=_limits_set)
    p = limits.add_parser("show", parents=[common, part], help="show limits")
    p.add_argument("queue", nargs="?")
    p.set_defaults(handler=_limits_show)

    p = sub.add_parser("reserve", parents=[common, part, ident], help="reserve QUEUE RES=QTY ...")
    p.add_argument("queue")
    p.add_argument("resources", nargs="*", metavar="RES=QTY")
    p.add_argument("--ttl", type=float, help="seconds until the reservation expires")
    p.add_argument("--key", help="idempotency key (request id)")
    p.add_argument("--priority-class")
    p.set_defaults(handler=_reserve)
    p = sub.add_parser("commit", parents=[common], help="commit ID or prefix [RES=QTY ... to commit less]")
    p.add_argument("id")
    p.add_argument("resources", nargs="*", metavar="RES=QTY")
    p.set_defaults(handler=_commit)
    p = sub.add_parser(
        "rollback", parents=[common], help="roll back reservation ID (or a unique prefix of it)"
    )
    p.add_argument("id")
    p.set_defaults(handler=_rollback)
    p = sub.add_parser("show", parents=[common], help="show reservation ID (or a unique prefix)")
    p.add_argument("id")
    p.set_defaults(handler=_show)
    p = sub.add_parser("release", parents=[common, part, ident], help="release QUEUE RES=QTY ...")
    p.add_argument("queue")
    p.add_argument("resources", nargs="+", metavar="RES=QTY")
    p.add_argument("--finished", action="store_true", help="the application has finished")
    p.set_defaults(handler=_release)
    p = sub.add_parser(
        "usage", parents=[common, part], help="usage table of QUEUE's subtree; without QUEUE, the queue tree"
    )
    p.add_argument("queue", nargs="?")
    p.set_defaults(handler=_usage)
    p = sub.add_parser("sweep", parents=[common], help="expire reservations whose time ran out")
    p.add_argument("--once", action="store_true", help="one sweep, then exit")
    p.add_argument("--interval", type=float, help="seconds between sweeps (env QUOTA_LEDGER_SWEEP_INTERVAL)")
    p.add_argument("--batch-size", type=int, help="reservations per transaction")
    p.add_argument("--workers", type=int, default=1, help="batches in flight at once, one thread each")
    p.add_argument(
        "--max-rate",
        type=float,
        help="reservations per second at most, pausing between batches (env QUOTA_LEDGER_SWEEP_MAX_RATE)",
    )
    p.set_defaults(handler=_sweep)
    p = sub.add_parser("audit", parents=[common], help="check counters against the ledger history")
    p.add_argument("--fix", action="store_true", help="repair counters that disagree")
    p.add_argument("--partition", default=None)
    p.set_defaults(handler=_audit)

    config = sub.add_parser("config", help="queue configuration (YuniKorn format)").add_subparsers(
        title="config commands", metavar="ACTION"
    )
    p = config.add_parser("apply", parents=[common], help="apply FILE (YAML or JSON; - for stdin)")
    p.add_argument("file")
    p.add_argument(
        "--allow-removing-all",
        action="store_true",
        help="apply it even if it removes every limit of a partition (refused otherwise)",
    )
    p.set_defaults(handler=_config_apply)
    cli_config.register(config, common)
    p = config.add_parser("validate", parents=[common], help="list every problem of FILE; exit 1 if any")
    p.add_argument("file")
    p.set_defaults(handler=_config_validate)
    config.add_parser("show", parents=[common], help="print the configuration in force").set_defaults(
        handler=_config_show
    )
    p = sub.add_parser("users", parents=[common, part], help="user usage and limits (all, or NAME)")
    p.add_argument("name", nargs="?")
    p.set_defaults(handler=_users)
    p = sub.add_parser("groups", parents=[common, part], help="group usage and limits (all, or NAME)")
    p.add_argument("name", nargs="?")
    p.set_defaults(handler=_groups)
    p = sub.add_parser("app-summary", parents=[common, part], help="usage summary of a finished application")
    p.add_argument("application")
    p.set_defaults(handler=_app_summary)
    namespace = sub.add_parser("namespace", help="Kubernetes namespaces on queues").add_subparsers(
        title="namespace commands", metavar="ACTION"
    )
    p = namespace.add_parser("apply", parents=[common, part], help="place a Namespace manifest FILE")
    p.add_argument("file")
    p.set_defaults(handler=_namespace_apply)
    quota = sub.add_parser("quota", help="Kubernetes ResourceQuotas").add_subparsers(
        title="quota commands", metavar="ACTION"
    )
    p = quota.add_parser("apply", parents=[common, part], help="create or replace a ResourceQuota from FILE")
    p.add_argument("file")
    p.set_defaults(handler=_quota_apply)
    for action, handler, text in (
        ("delete", _quota_delete, "delete NAMESPACE NAME"),
        ("status", _quota_status, "hard and used of NAMESPACE NAME"),
    ):
        p = quota.add_parser(action, parents=[common, part], help=text)
        p.add_argument("namespace")
        p.add_argument("name")
        p.set_defaults(handler=handler)
    admission = sub.add_parser("admission", help="ResourceQuota admission configuration").add_subparsers(
        title="admission commands", metavar="ACTION"
    )
    p = admission.add_parser("apply", parents=[common, part], help="set it from FILE")
    p.add_argument("file")
    p.set_defaults(handler=_admission_apply)
    pod = sub.add_parser("pod", help="Kubernetes Pods as reservations").add_subparsers(
        title="pod commands", metavar="ACTION"
    )
    p = pod.add_parser("reserve", parents=[common, part], help="reserve what the Pod in FILE needs")
    p.add_argument("file")
    p.add_argument("--ttl", type=float)
    p.add_argument("--key", help="default: the pod's metadata.uid")
    p.set_defaults(handler=_pod_reserve)
    p = pod.add_parser("release", parents=[common, part], help="release the Pod in FILE (it is gone)")
    p.add_argument("file")
    p.add_argument("--key")
    p.add_argument("--finished", action="store_true")
    p.set_defaults(handler=_pod_release)
    cli_service.register(sub, common)
    return parser


def _pairs(items: Sequence[str], *, allow_none: bool = False) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise InvalidRequest(f"expected RESOURCE=QUANTITY, got {item!r}", field=item)
        result[name] = None if allow_none and value.lower() == "none" else value
    return result


def _print_reservation(args: argparse.Namespace, reservation: Reservation) -> int:
    if args.json:
        _emit(dataclasses.asdict(reservation))
    else:
        print("\n".join(cli_output.reservation_lines(reservation)))
    return 0


def _json_default(value: object) -> object:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, tuple | set):
        return list(value)
    raise TypeError(type(value).__name__)


def _emit(data: object) -> None:
    print(json.dumps(data, default=_json_default, indent=2, sort_keys=True))


def _say(args: argparse.Namespace, data: dict[str, Any], template: str) -> None:
    if args.json:
        _emit(data)
    else:
        print(template.format(**data))


def _fail(args: argparse.Namespace, error: QuotaLedgerError, **extra: Any) -> None:
    if args.json:
        print(
            json.dumps(
                {"error": type(error).__name__, "message": str(error), **extra},
                default=_json_default,
                indent=2,
            ),
            file=sys.stderr,
        )
    else:
        print(f"error: {error}", file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
