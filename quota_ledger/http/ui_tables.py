"""The dashboard's tables as HTML fragments: queues, users and groups, pending reservations, quotas.

Quantities are written in base units inside ``<span class=q data-r=RESOURCE data-v=VALUE>``;
the page's script shows them in human units (``8Gi``, ``1.5`` cores). A bar's level is ``warn``
from 80 % of its limit and ``over`` from 100 % (in use plus reserved), on the bar, its
percentage and its table row.

No element has a ``style`` attribute (the page's Content-Security-Policy allows none): a bar's
widths and a queue's indentation are classes, whose rules are :data:`STYLE_RULES`.
"""

from __future__ import annotations

import html
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from quota_ledger.model.values import Reservation, Usage

WARN_AT = 0.8
#: queue depths indented each a step further; deeper queues stay at the last
_DEPTHS = 12
_e = html.escape
#: the widths of a bar's parts (``w0`` to ``w100``, per cent) and the indentation of a queue's
#: name by its depth (``d0`` to ``d12``), appended to the page's style sheet
STYLE_RULES = "".join(f".w{n}{{width:{n}%}}" for n in range(101)) + "".join(
    f"td.name.d{n}{{padding-left:{0.5 + n * 1.1:.1f}rem}}" for n in range(_DEPTHS + 1)
)


def q(resource: str, value: int | None) -> str:
    """A quantity in base units, for the script to format."""
    if value is None:
        return "<span class=muted>-</span>"
    negative = " negative" if value < 0 else ""
    return f"<span class='q{negative}' data-r='{_e(resource)}' data-v='{value}'>{value}</span>"


def path(queue: str) -> str:
    """A queue's path that may wrap after each dot (and hyphen) when its column is narrow."""
    return ".<wbr>".join(_e(part) for part in queue.split("."))


def level(used: int, limit: int | None) -> str:
    """``over``, ``warn`` or ``ok`` for ``used`` (in use plus reserved) against ``limit``."""
    if limit is None or used <= 0:
        return "ok"
    if used >= limit:
        return "over"
    return "warn" if used >= WARN_AT * limit else "ok"


def meter(in_use: int, reserved: int, limit: int | None) -> str:
    """A bar of in use and reserved against the limit, with the percentage used."""
    if limit is None:
        return "<span class=muted>no limit</span>"
    total = in_use + reserved
    state = level(total, limit)
    if limit == 0:
        percent = "-" if total == 0 else "over"
        used_width = reserved_width = 0
    else:
        percent = f"{100 * total / limit:.0f}%"
        used_width = _width(in_use, limit, 100)
        reserved_width = _width(reserved, limit, 100 - used_width)
    return (
        f"<div class=meter><div class='bar {state}'>"
        f"<span class='used w{used_width}'></span>"
        f"<span class='reserved w{reserved_width}'></span></div>"
        f"<span class='pct {state}'>{percent}</span></div>"
    )


def _width(amount: int, limit: int, room: int) -> int:
    """``amount`` of ``limit`` in whole per cent, at most ``room``; 1 for any amount above 0."""
    if amount <= 0:
        return 0
    return min(room, max(1, round(100 * amount / limit)))


def legend() -> str:
    return (
        "<div class=legend id=legend><span><i class=used></i>in use</span>"
        "<span><i class=reserved></i>reserved</span><span><i class=free></i>available</span>"
        "<span><i class=warn></i>at 80% of the limit</span>"
        "<span><i class=over></i>at or over the limit</span>"
        "</div>"
    )


def queue_table(tree: dict[str, dict[str, Usage]], link: dict[str, str], selected: str) -> str:
    """Every queue with usage or a limit; the queue's name selects it for the history chart."""
    if not tree:
        return "<p id=queue-tree class=muted>No usage or limits yet.</p>"
    rows = [
        "<table id=queue-tree><thead><tr><th>queue</th><th>resource</th><th class=num>in use</th>"
        "<th class=num>reserved</th><th class=num>limit</th><th class=num>available</th>"
        "<th>used of limit</th></tr></thead><tbody>"
    ]
    for queue in sorted(tree):
        depth = queue.count(".")
        href = "?" + urlencode({**link, "queue": queue})
        for index, (resource, usage) in enumerate(sorted(tree[queue].items())):
            state = level(usage.in_use + usage.reserved, usage.limit)
            classes = " ".join(
                c
                for c in (
                    "queue",
                    state,
                    "first" if index == 0 else "",
                    "selected" if queue == selected else "",
                )
                if c
            )
            name = (
                f"<a href='{_e(href)}' title='usage over time of {_e(queue)}'>"
                f"{_e(queue.rsplit('.', 1)[-1])}</a>"
                if index == 0
                else ""
            )
            rows.append(
                f"<tr class='{classes}' data-queue='{_e(queue)}' data-resource='{_e(resource)}'>"
                f"<td class='name d{min(depth, _DEPTHS)}'>{name}</td>"
                f"<td>{_e(resource)}</td><td class=num>{q(resource, usage.in_use)}</td>"
                f"<td class=num>{q(resource, usage.reserved)}</td>"
                f"<td class='num limit'>{q(resource, usage.limit)}</td>"
                f"<td class='num available'>{q(resource, usage.available)}</td>"
                f"<td class=barcell>{meter(usage.in_use, usage.reserved, usage.limit)}</td></tr>"
            )
    rows.append("</tbody></table>")
    return "".join(rows)


@dataclass(frozen=True, kw_only=True, slots=True)
class LimitRow:
    """One limit of a user or group at one queue, and the usage against it."""

    queue: str
    resource: str
    used: int
    limit: int | None

    @property
    def share(self) -> float:
        if self.limit is None:
            return -1.0
        return float("inf") if self.limit == 0 else self.used / self.limit


def limit_rows(report: dict[str, Any]) -> list[LimitRow]:
    """The limits in a YuniKorn user or group report, with usage; the root's usage if none."""
    root = report.get("queues") or {}
    found: list[LimitRow] = []
    for node in _nodes(root):
        usage = node.get("resourceUsage") or {}
        for resource, limit in sorted((node.get("maxResources") or {}).items()):
            found.append(
                LimitRow(queue=node["queuePath"], resource=resource, used=usage.get(resource, 0), limit=limit)
            )
        if node.get("maxApplications"):
            running = len(node.get("runningApplications") or [])
            found.append(
                LimitRow(
                    queue=node["queuePath"],
                    resource="applications",
                    used=running,
                    limit=node["maxApplications"],
                )
            )
    if not found:
        usage = root.get("resourceUsage") or {}
        found = [
            LimitRow(queue=root.get("queuePath", "root"), resource=r, used=v, limit=None)
            for r, v in sorted(usage.items())
        ]
    return found


def _nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    if not node:
        return
    yield node
    for child in node.get("children") or []:
        yield from _nodes(child)


def identity_table(table_id: str, field: str, reports: list[dict[str, Any]], shown: int = 12) -> str:
    """Users or groups with their limits, those nearest a limit first."""
    ranked = sorted(
        ((str(r[field]), limit_rows(r)) for r in reports),
        key=lambda item: (
            max((row.share for row in item[1]), default=-1.0),
            sum(row.used for row in item[1]),
        ),
        reverse=True,
    )
    if not ranked:
        return f"<p id={table_id} class=muted>None tracked or configured.</p>"
    rows = [
        f"<table id={table_id}><thead><tr><th>name</th><th>queue</th><th>resource</th>"
        "<th class=num>usage</th><th class=num>limit</th><th>used of limit</th></tr></thead><tbody>"
    ]
    for name, limits in ranked[:shown]:
        if not limits:
            rows.append(
                f"<tr class='identity first'><td class=name>{_e(name)}</td>"
                "<td colspan=5 class=muted>no usage</td></tr>"
            )
        for index, row in enumerate(limits):
            state = level(row.used, row.limit)
            first = " first" if index == 0 else ""
            rows.append(
                f"<tr class='identity {state}{first}' data-name='{_e(name)}'>"
                f"<td class=name>{_e(name) if index == 0 else ''}</td>"
                f"<td class=path>{path(row.queue)}</td><td>{_e(row.resource)}</td>"
                f"<td class=num>{q(row.resource, row.used)}</td>"
                f"<td class='num limit'>{q(row.resource, row.limit)}</td>"
                f"<td class=barcell>{meter(row.used, 0, row.limit)}</td></tr>"
            )
    rows.append("</tbody></table>")
    if len(ranked) > shown:
        rows.append(f"<p class=muted>and {len(ranked) - shown} more</p>")
    return "".join(rows)


def pending_table(pending: list[Reservation]) -> str:
    if not pending:
        return "<p id=pending class=muted>No pending reservations.</p>"
    now = datetime.now(UTC)
    rows = [
        "<table id=pending><thead><tr><th>reservation</th><th>queue</th><th>user</th><th>resources</th>"
        "<th class=num>expires in</th></tr></thead><tbody>"
    ]
    for r in pending:
        left = max(0.0, (r.expires_at - now).total_seconds())
        amounts = ", ".join(f"{_e(k)} {q(k, v)}" for k, v in sorted(r.resources.items()))
        rows.append(
            f"<tr><td title='{_e(r.id)}'><code>{_e(r.id[:8])}</code></td><td class=path>{path(r.queue)}</td>"
            f"<td class=name>{_e(r.user or '')}</td><td>{amounts}</td>"
            f"<td class=num>{remaining(left)}</td></tr>"
        )
    rows.append("</tbody></table>")
    return "".join(rows)


def waiting_table(lines: list[tuple[str, int, float]]) -> str:
    """Per queue: how many requests wait for capacity, and how long the longest has waited."""
    if not lines:
        return "<p id=waiting class=muted>Nobody waits for capacity.</p>"
    rows = [
        "<table id=waiting><thead><tr><th>queue</th><th class=num>waiting</th>"
        "<th class=num>longest wait</th></tr></thead><tbody>"
    ]
    for queue, count, age in lines:
        rows.append(
            f"<tr><td class=path>{path(queue)}</td><td class=num>{count}</td>"
            f"<td class=num>{remaining(age)}</td></tr>"
        )
    rows.append("</tbody></table>")
    return "".join(rows)


def remaining(seconds: float) -> str:
    """A time left as a person reads it: ``45 s``, ``59 min``, ``2 h 5 min``, ``3 d 4 h``."""
    whole = int(seconds)
    if whole < 60:
        return f"{whole} s"
    minutes = whole // 60
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


def quota_table(quotas: list[tuple[str, dict[str, Any]]]) -> str:
    if not quotas:
        return "<p id=resource-quotas class=muted>No ResourceQuotas.</p>"
    rows = [
        "<table id=resource-quotas><thead><tr><th>quota</th><th>resource</th><th class=num>used</th>"
        "<th class=num>hard</th></tr></thead><tbody>"
    ]
    for key, status in quotas:
        for index, (resource, hard) in enumerate(sorted(status["hard"].items())):
            rows.append(
                f"<tr class='{'first' if index == 0 else ''}'><td>{_e(key) if index == 0 else ''}</td>"
                f"<td>{_e(resource)}</td><td class=num>{_e(status['used'].get(resource, '0'))}</td>"
                f"<td class=num>{_e(hard)}</td></tr>"
            )
    rows.append("</tbody></table>")
    return "".join(rows)
