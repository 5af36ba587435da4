"""``GET /ui``: a server-rendered dashboard (no build step, no JavaScript needed).

The queue tree with used, reserved and limit per resource as bars; the busiest users and groups;
the pending reservations that expire next; the ResourceQuota status table. Open it once as
``/ui?token=...`` (a reader token): the token is then kept in an HTTP-only cookie.
"""

import html
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import HTMLResponse

from quota_ledger import overview, queues
from quota_ledger.engine import QuotaEngine
from quota_ledger.http import models
from quota_ledger.http.auth import Authenticator, check_scope
from quota_ledger.quantity import format_quantity
from quota_ledger.values import Usage

_STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5rem;color:#1d2330;background:#f7f8fa}
h1{font-size:1.4rem}h2{font-size:1.1rem;margin-top:1.6rem}
table{border-collapse:collapse;background:#fff;min-width:40rem}
td,th{padding:.3rem .6rem;border-bottom:1px solid #e3e6eb;text-align:left;font-size:.9rem;vertical-align:middle}
th{background:#eef1f5}.num{text-align:right;font-variant-numeric:tabular-nums}
.bar{display:inline-block;width:12rem;height:.8rem;background:#e3e6eb;border-radius:.2rem;overflow:hidden;vertical-align:middle}
.used{display:inline-block;height:100%;background:#3b7dd8}.reserved{display:inline-block;height:100%;background:#9cc0f0}
.over .used{background:#d8453b}.muted{color:#6b7382}
"""


def build(engine: QuotaEngine, auth: Authenticator) -> APIRouter:
    router = APIRouter(tags=["dashboard"])

    @router.get(
        "/ui",
        response_class=HTMLResponse,
        responses={code: {"model": models.ErrorOut} for code in (401, 403, 422, 503)},
    )
    def dashboard(
        request: Request,
        partition: Annotated[str, Query(max_length=64)] = "default",
        token: Annotated[str | None, Query(max_length=200)] = None,
    ) -> HTMLResponse:
        """The dashboard (reader role; ``?token=`` once, then a cookie)."""
        if token is not None:
            found = auth.lookup(token)
            if found is None:
                raise HTTPException(401, "unknown or revoked token")
        else:
            found = auth.token_of(request)
        if not found.allows("reader"):
            raise HTTPException(403, "the dashboard needs the reader role")
        queues.validate_partition(partition)
        check_scope(found, partition, None)
        page = render(engine, partition)
        response = HTMLResponse(page)
        if token is not None:
            response.set_cookie("quota_ledger_token", token, httponly=True, samesite="strict")
        return response

    return router


def render(engine: QuotaEngine, partition: str) -> str:
    tree = overview.queue_tree(engine, partition)
    users = engine.user_usages(partition=partition)
    groups = engine.group_usages(partition=partition)
    pending = overview.soonest_expiring(engine, partition, 15)
    quotas = [
        (f"{ns}/{name}", engine.resource_quota_status(ns, name, partition=partition))
        for ns, name in engine.resource_quotas(partition=partition)
    ]
    e = html.escape
    parts = [
        "<!doctype html><html lang=en><head><meta charset=utf-8>",
        f"<title>quota-ledger: {e(partition)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>quota-ledger <span class=muted>partition {e(partition)}</span></h1>",
        "<h2>Queues</h2>",
        _queue_table(tree),
        "<h2>Busiest users</h2>",
        _identity_table("users", "userName", users),
        "<h2>Busiest groups</h2>",
        _identity_table("groups", "groupName", groups),
        "<h2>Pending reservations expiring next</h2>",
        _pending_table(pending),
        "<h2>ResourceQuotas</h2>",
        _quota_table(quotas),
        "</body></html>",
    ]
    return "".join(parts)


def _bar(used: int, reserved: int, limit: int | None) -> str:
    if not limit:
        return "<span class=muted>no limit</span>" if limit is None else "<span class=muted>limit 0</span>"
    u = min(100.0, 100.0 * used / limit)
    r = min(100.0 - u, 100.0 * reserved / limit)
    over = " over" if used + reserved > limit else ""
    return (
        f"<span class='bar{over}' title='{used + reserved} of {limit}'>"
        f"<span class=used style='width:{u:.1f}%'></span><span class=reserved style='width:{r:.1f}%'></span></span>"
    )


def _fmt(resource: str, value: int | None) -> str:
    if value is None:
        return "-"
    if resource == "applications":
        return str(value)
    return html.escape(
        format_quantity(resource, value) if value >= 0 else f"-{format_quantity(resource, -value)}"
    )


def _queue_table(tree: dict[str, dict[str, Usage]]) -> str:
    if not tree:
        return "<p id=queue-tree class=muted>No usage or limits yet.</p>"
    rows = [
        "<table id=queue-tree><tr><th>queue</th><th>resource</th><th class=num>in use</th>"
        "<th class=num>reserved</th><th class=num>limit</th><th>used</th></tr>"
    ]
    for queue in sorted(tree):
        depth = queue.count(".")
        for index, (resource, usage) in enumerate(sorted(tree[queue].items())):
            name = html.escape(queue.rsplit(".", 1)[-1]) if index == 0 else ""
            rows.append(
                f"<tr class=queue data-queue='{html.escape(queue)}'><td style='padding-left:{0.6 + depth * 1.2:.1f}rem'>"
                f"{name}</td><td>{html.escape(resource)}</td><td class=num>{_fmt(resource, usage.in_use)}</td>"
                f"<td class=num>{_fmt(resource, usage.reserved)}</td><td class=num>{_fmt(resource, usage.limit)}</td>"
                f"<td>{_bar(usage.in_use, usage.reserved, usage.limit)}</td></tr>"
            )
    rows.append("</table>")
    return "".join(rows)


def _identity_table(table_id: str, field: str, reports: list[dict[str, Any]]) -> str:
    def weight(report: dict[str, Any]) -> tuple[int, int]:
        root = report.get("queues") or {}
        usage = root.get("resourceUsage") or {}
        return len(root.get("runningApplications") or []), sum(usage.values())

    ranked = sorted(reports, key=weight, reverse=True)[:10]
    if not ranked:
        return f"<p id={table_id} class=muted>Nothing tracked.</p>"
    rows = [
        f"<table id={table_id}><tr><th>name</th><th class=num>running applications</th><th>usage</th></tr>"
    ]
    for report in ranked:
        root = report.get("queues") or {}
        usage = ", ".join(
            f"{html.escape(k)}={_fmt(k, v)}" for k, v in sorted((root.get("resourceUsage") or {}).items())
        )
        rows.append(
            f"<tr><td>{html.escape(str(report[field]))}</td><td class=num>{len(root.get('runningApplications') or [])}</td>"
            f"<td>{usage or '<span class=muted>none</span>'}</td></tr>"
        )
    rows.append("</table>")
    return "".join(rows)


def _pending_table(pending: list[Any]) -> str:
    if not pending:
        return "<p id=pending class=muted>No pending reservations.</p>"
    now = datetime.now(UTC)
    rows = [
        "<table id=pending><tr><th>reservation</th><th>queue</th><th>resources</th><th class=num>expires in</th></tr>"
    ]
    for r in pending:
        left = (r.expires_at - now).total_seconds()
        amounts = ", ".join(f"{html.escape(k)}={_fmt(k, v)}" for k, v in r.resources.items())
        rows.append(
            f"<tr><td>{html.escape(r.id)}</td><td>{html.escape(r.queue)}</td><td>{amounts}</td>"
            f"<td class=num>{max(0.0, left):.0f} s</td></tr>"
        )
    rows.append("</table>")
    return "".join(rows)


def _quota_table(quotas: list[tuple[str, dict[str, Any]]]) -> str:
    if not quotas:
        return "<p id=resource-quotas class=muted>No ResourceQuotas.</p>"
    rows = [
        "<table id=resource-quotas><tr><th>quota</th><th>resource</th><th class=num>used</th>"
        "<th class=num>hard</th></tr>"
    ]
    for key, status in quotas:
        for resource, hard in status["hard"].items():
            rows.append(
                f"<tr><td>{html.escape(key)}</td><td>{html.escape(resource)}</td>"
                f"<td class=num>{html.escape(status['used'].get(resource, '0'))}</td><td class=num>{html.escape(hard)}</td></tr>"
            )
    rows.append("</table>")
    return "".join(rows)
