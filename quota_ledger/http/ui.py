"""``GET /ui``: the dashboard an operator keeps open. Served whole by the service: no build step,
no CDN, works offline.

The queue tree with in use, reserved, limit and available per resource as bars (amber from 80 %
of a limit, red from 100 %); a chart of one queue's usage over the last window, rebuilt from the
ledger's history; users and groups against their limits; the pending reservations that expire
next; the ResourceQuotas. A partition and window switch, a link to the API docs. The page
refreshes its data every 15 seconds and says when it last did. A browser without a session is
shown the sign-in form (``quota_ledger.http.login``); a token in the address is never accepted.

The page's style sheet and script are inline, allowed by their hashes in its
Content-Security-Policy, computed here from the files as they are served.
"""

from __future__ import annotations

import html
import json
from functools import cache
from importlib import resources
from typing import Annotated
from urllib.parse import urlencode

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import HTMLResponse

from quota_ledger.engine import QuotaEngine
from quota_ledger.http import browser, login, models, ui_tables
from quota_ledger.http.auth import Authenticator, check_scope
from quota_ledger.model import history, queues
from quota_ledger.model.values import Usage
from quota_ledger.runtime import overview

_e = html.escape


@cache
def _asset(name: str) -> str:
    return resources.files("quota_ledger.http").joinpath("static", name).read_text(encoding="utf-8")


_STYLE = _asset("dashboard.css") + ui_tables.STYLE_RULES
_SCRIPT = _asset("dashboard.js")
POLICY = browser.content_security_policy(scripts=[_SCRIPT], styles=[_STYLE])


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
        queue: Annotated[str, Query(max_length=255, description="the queue whose history is drawn")] = "root",
        window: Annotated[
            str, Query(max_length=8, description=f"one of {', '.join(history.WINDOWS)}")
        ] = "1h",
        refresh: Annotated[int, Query(ge=1, le=3600, description="seconds between refreshes")] = 15,
    ) -> HTMLResponse:
        """The dashboard (reader role): the session cookie of ``POST /ui/login``, or the
        ``Authorization`` header; without either, the sign-in form (401)."""
        found = auth.page_token(request)
        if found is None:
            return _sign_in(request)
        if not found.allows("reader"):
            raise HTTPException(403, "the dashboard needs the reader role")
        queues.validate_partition(partition)
        check_scope(found, partition, None)
        check_scope(found, partition, queues.validate_queue(queue))
        history.window_named(window)
        visible = [p for p in engine.driver.partitions() if found.covers(p, None)]
        response = HTMLResponse(render(engine, partition, queue, window, visible, refresh, who=found.name))
        return browser.protect(response, request, auth.sessions, POLICY)

    def _sign_in(request: Request) -> HTMLResponse:
        kept = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
        target = browser.safe_next("/ui" + (f"?{urlencode(kept)}" if kept else ""))
        held = auth.sessions.held(request)
        # A valid cookie the request may not use (the page was opened from another site of this
        # host): the page says who is signed in, and its link, opened from here, works.
        current = auth.session(request)
        if "token" in request.query_params:
            notice = "A token in the address is not accepted: paste it here instead."
        elif held and current is None:
            notice = "The session has ended (its token was revoked or replaced): sign in again."
        else:
            notice = None
        response = login.page(auth, request, target=target, status=401, notice=notice, signed_in=current)
        if held and current is None:
            auth.sessions.end(response, request)
        return response

    return router


def render(
    engine: QuotaEngine,
    partition: str,
    queue: str,
    window: str,
    partitions: list[str],
    refresh: int = 15,
    *,
    who: str = "",
) -> str:
    """The whole page for one partition, with the history of ``queue`` over ``window``."""
    tree = overview.queue_tree(engine, partition)
    users = engine.user_usages(partition=partition)
    groups = engine.group_usages(partition=partition)
    pending = overview.soonest_expiring(engine, partition, 15)
    pending_count = sum(n for p, n, _ in overview.pending_summary(engine) if p == partition)
    lines = [(q, n, age) for p, q, n, age in overview.waiting_summary(engine) if p == partition]
    waiting_count = sum(n for _, n, _ in lines)
    quotas = [
        (f"{ns}/{name}", engine.resource_quota_status(ns, name, partition=partition))
        for ns, name in engine.resource_quotas(partition=partition)
    ]
    found = overview.usage_history(engine, queue, partition=partition, window=window)
    data = models.UsageHistoryOut.of(found).model_dump(mode="json")
    api = "/v1/usage/history?" + urlencode({"queue": queue, "partition": partition, "window": window})
    link = {"partition": partition, "window": window} | ({"refresh": str(refresh)} if refresh != 15 else {})
    # Inside <script>, "<" would let data close the element: JSON allows it as \u003c.
    payload = json.dumps(data, separators=(",", ":")).replace("<", "\\u003c")
    generated = found.end.isoformat()
    parts = [
        "<!doctype html><html lang=en><head><meta charset=utf-8>",
        "<meta name=viewport content='width=device-width, initial-scale=1'>",
        f"<title>quota-ledger: {_e(partition)}</title><style>{_STYLE}</style></head>",
        f"<body data-refresh-seconds={refresh}>",
        "<header class=top>",
        f"<h1>quota-ledger <span>partition {_e(partition)}</span></h1>",
        _controls(partitions, partition, queue, window, refresh),
        "<span class=spacer></span>",
        "<span id=refresh-state><label><input type=checkbox id=auto-refresh checked> "
        f"auto-refresh {refresh} s</label> ",
        f"<span id=refresh-text>data of {_e(found.end.strftime('%H:%M:%S'))} UTC</span></span>",
        "<nav><a id=docs-link href='/docs'>API docs</a>",
        f"<a id=history-link href='{_e(api)}'>history as JSON</a></nav>",
        "<form id=logout method=post action='/ui/logout'>"
        f"<span id=who title='the token this browser is signed in with'>{_e(who)}</span>"
        "<button type=submit>sign out</button></form>",
        "</header>",
        "<main id=content>",
        f"<time id=generated datetime='{_e(generated)}' hidden></time>",
        _summary(tree, users, groups, pending_count),
        "<div class=columns><div class=column>",
        "<section class=panel id=queues-panel><h2>Queues <small>usage of each subtree against the "
        "queue's own limit; select a queue to chart it</small></h2>",
        ui_tables.legend(),
        ui_tables.queue_table(tree, link, queue),
        "</section>",
        "<section class=panel><h2>Pending reservations expiring next "
        f"<small>{pending_count} pending</small></h2>",
        ui_tables.pending_table(pending),
        "</section>",
        "<section class=panel><h2>Waiting for capacity "
        f"<small>{waiting_count} waiting, by queue</small></h2>",
        ui_tables.waiting_table(lines),
        "</section>",
        "<section class=panel><h2>ResourceQuotas</h2>",
        ui_tables.quota_table(quotas),
        "</section></div><div class=column>",
        f"<section class=panel id=history-panel><h2>Usage over time <small>{_e(queue)}, last "
        f"{_e(window)}, a point every {_duration(found.window.step)}</small></h2>",
        "<div class=legend><span><i class=used></i>in use</span><span><i class=reserved></i>reserved</span>"
        "<span><i class=limit></i>limit</span></div>",
        "<div id=history-chart><p class=empty>The chart needs JavaScript; the data is at "
        f"<a href='{_e(api)}'>{_e(api)}</a>.</p></div>",
        f"<script type=application/json id=history-data>{payload}</script>",
        "</section>",
        "<section class=panel><h2>Users <small>against their limits, nearest first</small></h2>",
        ui_tables.identity_table("users", "userName", users),
        "</section>",
        "<section class=panel><h2>Groups <small>against their limits, nearest first</small></h2>",
        ui_tables.identity_table("groups", "groupName", groups),
        "</section></div></div></main>",
        f"<script>{_SCRIPT}</script>",
        "</body></html>",
    ]
    return "".join(parts)


def _controls(partitions: list[str], partition: str, queue: str, window: str, refresh: int) -> str:
    names = sorted(set(partitions) | {partition})
    options = "".join(f"<option{' selected' if p == partition else ''}>{_e(p)}</option>" for p in names)
    windows = "".join(
        f"<option{' selected' if w == window else ''}>{_e(w)}</option>" for w in history.WINDOWS
    )
    return (
        "<form id=controls method=get action='/ui'>"
        f"<label>partition<select name=partition id=partition-switch>{options}</select></label>"
        f"<label>history<select name=window id=window-switch>{windows}</select></label>"
        f"<input type=hidden name=queue value='{_e(queue)}'>"
        f"<input type=hidden name=refresh value={refresh}>"
        "<noscript><button>show</button></noscript></form>"
    )


def _summary(
    tree: dict[str, dict[str, Usage]],
    users: list[dict[str, object]],
    groups: list[dict[str, object]],
    pending: int,
) -> str:
    states = {
        queue: {ui_tables.level(u.in_use + u.reserved, u.limit) for u in usage.values()}
        for queue, usage in tree.items()
    }
    over = sum(1 for s in states.values() if "over" in s)
    near = sum(1 for s in states.values() if "warn" in s and "over" not in s)
    limited = sum(1 for usage in tree.values() if any(u.limit is not None for u in usage.values()))
    identities = [row for r in [*users, *groups] for row in ui_tables.limit_rows(r)]
    at_limit = sum(1 for row in identities if ui_tables.level(row.used, row.limit) == "over")
    cards = [
        ("", len(tree), "queues with usage or limits", "queue-count"),
        ("", limited, "queues with limits", "limited-count"),
        ("warn" if near else "", near, "queues near a limit (80% and up)", "near-count"),
        ("over" if over else "", over, "queues at or over a limit", "over-count"),
        ("over" if at_limit else "", at_limit, "user or group limits reached", "identity-over-count"),
        ("", pending, "pending reservations", "pending-count"),
    ]
    return (
        "<div class=summary id=summary>"
        + "".join(
            f"<div class='card {c}' id={i}><b>{n}</b><span>{_e(t)}</span></div>" for c, n, t, i in cards
        )
        + "</div>"
    )


def _duration(seconds: int) -> str:
    return f"{seconds // 60} min" if seconds % 60 == 0 else f"{seconds} s"
