"""What the ``quota-ledger`` command prints: for people, tables in each resource's own units;
with ``--json``, the same facts as JSON in base units (errors too, on standard error).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import datetime
from enum import Enum
from typing import TYPE_CHECKING, Any

from quota_ledger.model import url_text
from quota_ledger.model.quantity import KUBE_CPU_NAMES, format_human

if TYPE_CHECKING:
    from quota_ledger.model.errors import QuotaLedgerError
    from quota_ledger.model.values import Drift, Reservation, Usage
    from quota_ledger.runtime.tokens import Token

USAGE_HEADER = ["RESOURCE", "IN USE", "RESERVED", "LIMIT", "AVAILABLE", "USED", ""]


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns two spaces apart, as ``kubectl get`` prints them."""
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=False)]
    lines = [
        "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=False)).rstrip() for r in [header, *rows]
    ]
    return "\n".join(lines)


def human(resource: str, units: int | None) -> str:
    """An amount in the resource's own units; ``-`` for none (no limit)."""
    return "-" if units is None else format_human(resource, units)


def amounts(resources: Mapping[str, int]) -> str:
    """``memory=1Gi, vcore=500m``."""
    return ", ".join(f"{r}={format_human(r, a)}" for r, a in resources.items())


def bar(fraction: float, width: int = 20) -> str:
    filled = max(0, min(width, round(fraction * width)))
    return "[" + "#" * filled + "." * (width - filled) + "]"


def _usage_cells(resource: str, u: Usage) -> list[str]:
    share = "" if not u.limit else f"{100 * (u.in_use + u.reserved) / u.limit:5.1f}%"
    meter = "" if not u.limit else bar((u.in_use + u.reserved) / u.limit)
    return [
        resource,
        human(resource, u.in_use),
        human(resource, u.reserved),
        human(resource, u.limit),
        human(resource, u.available),
        share,
        meter,
    ]


def usage_table(usage: Mapping[str, Usage]) -> str:
    """One queue's subtree: a row per resource."""
    return table(USAGE_HEADER, [_usage_cells(res, u) for res, u in usage.items()])


def usage_tree(tree: Mapping[str, Mapping[str, Usage]]) -> str:
    """Every queue, indented under its parent, a row per resource (the queue named once)."""
    rows = []
    for queue in sorted(tree):
        name = "  " * queue.count(".") + queue.rsplit(".", 1)[-1]
        for index, (res, u) in enumerate(sorted(tree[queue].items())):
            rows.append([name if index == 0 else "", *_usage_cells(res, u)])
    return table(["QUEUE", *USAGE_HEADER], rows)


def identity_table(kind: str, reports: Iterable[Mapping[str, Any]]) -> str:
    """Users' or groups' usage (YuniKorn's REST shape) as a table: a row per queue and resource,
    with the limit there, what is left of it and the running applications (of the maximum)."""
    name_key = "userName" if kind == "user" else "groupName"
    rows: list[list[str]] = []
    for report in reports:
        nodes = _flatten(report.get("queues"))
        if not nodes:
            rows.append([str(report[name_key]), "-", "0", "", "", "", ""])
        for n, node in enumerate(nodes):
            usage: dict[str, int] = node.get("resourceUsage") or {}
            limits: dict[str, int] = node.get("maxResources") or {}
            running = len(node.get("runningApplications") or [])
            most = node.get("maxApplications")
            apps = f"{running}/{most}" if most else str(running)
            resources = sorted(set(usage) | set(limits)) or [""]
            for r, res in enumerate(resources):
                used, limit = usage.get(res, 0), limits.get(res)
                rows.append(
                    [
                        str(report[name_key]) if n == 0 and r == 0 else "",
                        node["queuePath"] if r == 0 else "",
                        apps if r == 0 else "",
                        res,
                        human(res, used) if res else "",
                        human(res, limit) if res else "",
                        human(res, None if limit is None else limit - used) if res else "",
                    ]
                )
    header = [kind.upper(), "QUEUE", "APPLICATIONS", "RESOURCE", "USED", "LIMIT", "AVAILABLE"]
    return table(header, rows) if rows else f"no {kind}s tracked"


def _flatten(node: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    if not node:
        return []
    found = [node]
    for child in node.get("children") or []:
        found += _flatten(child)
    return found


def reservation_lines(reservation: Reservation) -> list[str]:
    """``<id> <state> <queue> [memory=1Gi, vcore=500m]`` and its expiry, key and commit."""
    lines = [
        f"{reservation.id} {reservation.state.value} {reservation.queue} [{amounts(reservation.resources)}]",
        f"  expires {reservation.expires_at.isoformat(timespec='seconds')}"
        + (f"  key {reservation.key}" if reservation.key else ""),
    ]
    if reservation.committed is not None:
        lines.append(f"  committed [{amounts(reservation.committed)}]")
    if reservation.position is not None:
        lines.append(f"  waiting in line: position {reservation.position}, priority {reservation.priority}")
    return lines


def tokens_table(found: Iterable[Token]) -> str:
    """NAME ROLE STATE PARTITION QUEUE CREATED, never the token itself."""
    rows = [
        [
            t.name,
            t.role,
            "revoked" if t.revoked_at else "active",
            t.partition or "*",
            t.queue or "*",
            t.created_at.isoformat(timespec="seconds") if t.created_at else "",
        ]
        for t in found
    ]
    return table(["NAME", "ROLE", "STATE", "PARTITION", "QUEUE", "CREATED"], rows)


def drift_table(drifts: Iterable[Drift]) -> str:
    """The audit's findings: the stored and the expected in-use/reserved of each counter."""
    rows = []
    for d in drifts:
        # a ResourceQuota's cpu names count milli-cores, unlike a queue resource of that name
        milli = d.resource in KUBE_CPU_NAMES if d.scope_type == "quota" else None

        def pair(in_use: int, reserved: int, res: str = d.resource, milli: bool | None = milli) -> str:
            return f"{format_human(res, in_use, milli=milli)}/{format_human(res, reserved, milli=milli)}"

        scope = d.scope if d.name is None else f"{d.scope} ({d.name})"
        rows.append(
            [
                d.partition,
                d.scope_type,
                scope,
                d.resource,
                pair(d.in_use, d.reserved),
                pair(d.expected_in_use, d.expected_reserved),
                "fixed" if d.fixed else "not fixed",
            ]
        )
    return table(["PARTITION", "TYPE", "SCOPE", "RESOURCE", "IN USE/RESERVED", "EXPECTED", "STATUS"], rows)


# -- JSON and one-line results ------------------------------------------------------------------
def emit(data: object) -> None:
    """Print ``data`` as JSON: dates in ISO 8601, enums as their values, sets and tuples as lists."""
    print(json.dumps(data, default=_json_default, indent=2, sort_keys=True))


def say(args: argparse.Namespace, data: dict[str, Any], template: str) -> None:
    """A command's one-line result: ``data`` as JSON with ``--json``, else ``template`` filled in."""
    if args.json:
        emit(data)
    else:
        print(template.format(**data))


def reservation(args: argparse.Namespace, found: Reservation) -> int:
    """Print a reservation (JSON with ``--json``); 0, the exit code of the commands that do."""
    if args.json:
        emit(dataclasses.asdict(found))
    else:
        print("\n".join(reservation_lines(found)))
    return 0


def fail(
    args: argparse.Namespace, error: QuotaLedgerError, *, secrets: Collection[str] = (), **extra: Any
) -> None:
    """Report ``error`` on standard error: its class, message and ``extra`` facts with ``--json``;
    the message without any of ``secrets`` (passwords, tokens) or a URL's password."""
    message = url_text.scrub(str(error), secrets)
    if args.json:
        print(
            json.dumps(
                {"error": type(error).__name__, "message": message, **extra},
                default=_json_default,
                indent=2,
            ),
            file=sys.stderr,
        )
    else:
        print(f"error: {message}", file=sys.stderr)


def _json_default(value: object) -> object:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, tuple | set):
        return list(value)
    raise TypeError(type(value).__name__)
