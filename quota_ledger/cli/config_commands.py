"""The ``config`` commands: ``apply``, ``diff`` (a change reviewed before it is applied),
``validate`` and ``show``, on configurations in YuniKorn's format."""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import TYPE_CHECKING

from quota_ledger.cli import help_text, output, progress
from quota_ledger.cli.arguments import read_source
from quota_ledger.cli.exit_codes import EXIT_ERROR
from quota_ledger.model.errors import QuotaLedgerError
from quota_ledger.model.quantity import format_quantity

if TYPE_CHECKING:
    from quota_ledger.cli.parser import SharedOptions, Subcommands
    from quota_ledger.config.diff import ConfigDiff, LimitChange, OverLimit
    from quota_ledger.engine import QuotaEngine
    from quota_ledger.runtime.settings import Settings

#: a FILE argument
FILE_HELP = "a configuration in YuniKorn's format, YAML or JSON; - reads standard input"


def register(sub: Subcommands, options: SharedOptions) -> None:
    """Add ``config`` and its actions."""
    common = options.common
    config = help_text.add_group(sub, "config", help="queue configuration (YuniKorn format)")
    p = help_text.add_command(
        config,
        "apply",
        parents=[common],
        help="apply FILE (YAML or JSON; - for stdin)",
        description="Apply a configuration: it replaces the one in force as a new version, and says "
        "who it puts over a limit. One that removes every limit of a partition is refused without "
        "--allow-removing-all.",
        examples=[
            "quota-ledger config apply examples/queues.yaml",
            "kubectl get configmap yunikorn-configs -o jsonpath='{.data.queues\\.yaml}' "
            "| quota-ledger config apply -",
        ],
        exits={EXIT_ERROR: "error, or the configuration has problems (each is listed)"},
    )
    p.add_argument("file", help=FILE_HELP)
    p.add_argument(
        "--allow-removing-all",
        action="store_true",
        help="apply it even if it removes every limit of a partition (refused otherwise)",
    )
    p.set_defaults(handler=_config_apply)
    p = help_text.add_command(
        config,
        "diff",
        parents=[common],
        help="what applying FILE would change (limits added, removed, changed; who would be over)",
        description="What applying FILE would change: limits added, removed and changed, and who would "
        "then be over a limit. It changes nothing.",
        examples=[
            "quota-ledger config diff examples/queues.yaml",
            "quota-ledger config diff - --json < new.yaml",
        ],
    )
    p.add_argument("file", help=FILE_HELP)
    p.set_defaults(handler=_config_diff)
    p = help_text.add_command(
        config,
        "validate",
        parents=[common],
        help="list every problem of FILE; exit 1 if any",
        description="List every problem of FILE, as applying it would find them; it changes nothing.",
        examples=[
            "quota-ledger config validate examples/queues.yaml",
            "quota-ledger config validate - --json < new.yaml",
        ],
        exits={EXIT_ERROR: "the configuration has problems (each is listed), or another error"},
    )
    p.add_argument("file", help=FILE_HELP)
    p.set_defaults(handler=_config_validate)
    help_text.add_command(
        config,
        "show",
        parents=[common],
        help="print the configuration in force",
        description="Print the configuration in force, as YAML (--json: its version and the document).",
        examples=["quota-ledger config show", "quota-ledger config show --json"],
    ).set_defaults(handler=_config_show)


def _config_apply(engine: QuotaEngine, args: argparse.Namespace, _s: Settings) -> int:
    source = read_source(args.file)
    before = engine.config_version()
    try:  # who the change puts over a limit, as `config diff` says it; applying reports errors
        over = engine.diff_config(source).over_limit
    except QuotaLedgerError:
        over = ()
    with progress.bar(f"applying {args.file}", None):
        version = engine.apply_config(source, allow_removing_all=args.allow_removing_all)
    if version == before:
        output.say(args, {"version": version}, "configuration unchanged: version {version} stays in force")
        return 0
    if args.json:
        output.emit({"version": version, "over_limit": [dataclasses.asdict(o) for o in over]})
        return 0
    print(f"applied configuration version {version}")
    if over:
        print("over their limit after this change (nothing is evicted; new reservations there are refused):")
        print("\n".join(_aligned([("!", _who(o), o.resource, _over(o)) for o in over])))
    return 0


def _config_diff(engine: QuotaEngine, args: argparse.Namespace, _s: Settings) -> int:
    found = engine.diff_config(read_source(args.file))
    if args.json:
        print(json.dumps(found.as_dict(), indent=2, sort_keys=True))
    else:
        print(render(found))
    return 0


def _config_validate(engine: QuotaEngine, args: argparse.Namespace, _s: Settings) -> int:
    problems = engine.validate_config(read_source(args.file))
    if args.json:
        output.emit([dataclasses.asdict(p) for p in problems])
    elif not problems:
        print("configuration is valid")
    for problem in [] if args.json else problems:
        print(f"- {problem.describe()}")
    return EXIT_ERROR if problems else 0


def _config_show(engine: QuotaEngine, args: argparse.Namespace, _s: Settings) -> int:
    document = engine.config()
    if args.json:
        output.emit({"version": engine.config_version(), "config": document})
    else:
        import yaml

        print(yaml.safe_dump(document, sort_keys=False), end="")
    return 0


def render(diff: ConfigDiff) -> str:
    """The diff for people: one line per limit, amounts in each resource's own units."""
    lines = [f"compared with configuration version {diff.version}, the one in force"]
    if diff.identical:
        lines.append("identical: applying it changes nothing and makes no new version")
        return "\n".join(lines)
    sections = [
        ("limits added", "+", diff.added),
        ("limits changed", "~", diff.changed),
        ("limits removed", "-", diff.removed),
    ]
    rows = [
        (f"{title}:", [(mark, _who(c), c.resource, _change(c)) for c in changes])
        for title, mark, changes in sections
        if changes
    ]
    if not rows:
        lines.append("no limit changes (other settings differ)")
    for title, entries in rows:
        lines += ["", title, *_aligned(entries)]
    lines.append("")
    if diff.over_limit:
        lines.append(
            "over their limit after this change (nothing is evicted; new reservations there are refused):"
        )
        lines += _aligned([("!", _who(o), o.resource, _over(o)) for o in diff.over_limit])
    else:
        lines.append("nobody would be over a limit")
    for partition in diff.removes_all_limits:
        lines.append(
            f"\nthis removes every limit of partition {partition}: "
            "`config apply` refuses it without --allow-removing-all"
        )
    return "\n".join(lines)


def _who(entry: LimitChange | OverLimit) -> str:
    where = "" if entry.partition == "default" else f"[{entry.partition}] "
    if entry.name is None:
        return f"{where}queue {entry.queue}"
    return f"{where}{entry.kind} {entry.name} at {entry.queue}"


def _change(change: LimitChange) -> str:
    if change.old is None:
        return _amount(change.resource, change.new)
    if change.new is None:
        return f"was {_amount(change.resource, change.old)}"
    return f"{_amount(change.resource, change.old)} -> {_amount(change.resource, change.new)}"


def _over(over: OverLimit) -> str:
    res = over.resource
    text = (
        f"limit {_amount(res, over.limit)}, in use {_amount(res, over.in_use)}, "
        f"reserved {_amount(res, over.reserved)}"
    )
    if over.old_limit is not None and over.in_use + over.reserved > over.old_limit:
        text += " (over already)"
    return text


def _amount(resource: str, value: int | None) -> str:
    return "none" if value is None else format_quantity(resource, value)


def _aligned(rows: list[tuple[str, str, str, str]]) -> list[str]:
    who = max(len(r[1]) for r in rows)
    res = max(len(r[2]) for r in rows)
    return [
        f"  {mark} {name.ljust(who)}  {resource.ljust(res)}  {text}" for mark, name, resource, text in rows
    ]
