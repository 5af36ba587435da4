"""Signing a browser in and out: ``GET /ui/login`` (the form), ``POST /ui/login``, ``POST
/ui/logout``, and ``GET /`` (to the dashboard).

The form posts the token in its body, never in an address. A sign-in is refused when the form
came from another site (``Sec-Fetch-Site``, ``Origin``) or without the nonce of a form this
service served (login CSRF: another page cannot sign the browser in as someone else). A browser
signed in as one token is not silently signed in as another: the page says who is signed in,
and a sign-in as another token is refused (409) until that one signs out.
"""

from __future__ import annotations

import html
from functools import cache
from importlib import resources
from typing import Annotated
from urllib.parse import parse_qsl

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from quota_ledger.http import browser
from quota_ledger.http.auth import MAX_TOKEN, Authenticator
from quota_ledger.runtime.tokens import Token

_e = html.escape
#: the fields a sign-in form posts
_FIELDS = frozenset({"token", "next", "nonce"})


@cache
def _asset(name: str) -> str:
    return resources.files("quota_ledger.http").joinpath("static", name).read_text(encoding="utf-8")


_STYLE = _asset("login.css")
_SCRIPT = _asset("login.js")
POLICY = browser.content_security_policy(scripts=[_SCRIPT], styles=[_STYLE])


def page(
    auth: Authenticator,
    request: Request,
    *,
    target: str,
    status: int = 200,
    notice: str | None = None,
    signed_in: Token | None = None,
) -> HTMLResponse:
    """The sign-in page (or, for a browser signed in already, who it is signed in as)."""
    held = auth.sessions.nonce(request)
    # The nonce the browser holds, so that two open forms both work; else a new one.
    nonce = held or browser.new_nonce()
    body = _form(target, nonce) if signed_in is None else _signed_in(signed_in, target)
    notice_html = f"<p class=notice id=notice role=alert>{_e(notice)}</p>" if notice else ""
    response = HTMLResponse(
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        "<meta name=viewport content='width=device-width, initial-scale=1'>"
        f"<title>quota-ledger: sign in</title><style>{_STYLE}</style></head><body>"
        "<header><h1>quota-ledger <span>dashboard</span></h1></header>"
        f"<main><div class=box>{notice_html}{body}</div></main>"
        f"<script>{_SCRIPT}</script></body></html>",
        status_code=status,
    )
    if held is None and signed_in is None:
        auth.sessions.set_nonce(response, request, nonce)
    return browser.protect(response, request, auth.sessions, POLICY)


def _form(target: str, nonce: str) -> str:
    return (
        "<h2>Sign in</h2>"
        "<p>Paste a token of role <code>reader</code> or above (<code>quota-ledger tokens add NAME "
        "--role reader</code>). The dashboard only reads: changes go through the CLI or the API.</p>"
        "<form id=login method=post action='/ui/login'>"
        "<label for=token>Token</label>"
        f"<input type=password id=token name=token required maxlength={MAX_TOKEN} autocomplete=off "
        "autofocus spellcheck=false placeholder='qlt_...'>"
        f"<input type=hidden name=next value='{_e(target)}'>"
        f"<input type=hidden name=nonce value='{_e(nonce)}'>"
        "<div class=actions><button type=submit>Sign in</button></div></form>"
    )


def _signed_in(token: Token, target: str) -> str:
    scope = f", partition {token.partition}" if token.partition else ""
    return (
        "<h2>Signed in</h2>"
        f"<p>This browser is signed in as <span class=who id=who>{_e(token.name)}</span> "
        f"(role {_e(token.role)}{_e(scope)}). To sign in as another token, sign out first.</p>"
        "<form id=logout method=post action='/ui/logout' class=actions>"
        f"<a class=button href='{_e(target)}'>Continue</a>"
        "<button type=submit class=secondary>Sign out</button></form>"
    )


def build(auth: Authenticator) -> APIRouter:
    router = APIRouter(include_in_schema=False)
    sessions = auth.sessions

    @router.get("/")
    def home() -> RedirectResponse:
        return RedirectResponse("/ui", status_code=303)

    @router.get("/ui/login", response_class=HTMLResponse)
    def login_form(
        request: Request, next: Annotated[str | None, Query(max_length=2000)] = None
    ) -> HTMLResponse:
        return page(auth, request, target=browser.safe_next(next), signed_in=auth.session(request))

    @router.post("/ui/login")
    async def login(request: Request) -> Response:
        fields = await _posted(request)
        target = browser.safe_next(fields.get("next"))
        reason = sessions.foreign(request)
        if reason is not None:
            return page(auth, request, target=target, status=403, notice=f"Not signed in: {reason}.")
        if not sessions.nonce_matches(request, fields.get("nonce", "")):
            notice = "Not signed in: the sign-in form had expired or was not this service's. Try again."
            return page(auth, request, target=target, status=403, notice=notice)
        value = fields.get("token", "").strip()
        found = await run_in_threadpool(auth.lookup, value) if 0 < len(value) <= MAX_TOKEN else None
        if found is None:
            return page(auth, request, target=target, status=401, notice="Unknown or revoked token.")
        current = await run_in_threadpool(auth.session, request)
        if current is not None and current.name != found.name:
            notice = f"Already signed in as {current.name}: sign out before signing in as {found.name}."
            return page(auth, request, target=target, status=409, notice=notice, signed_in=current)
        request.state.token = found  # for the access log
        response = RedirectResponse(target, status_code=303)
        sessions.start(response, request, value)
        return browser.protect(response, request, sessions, None)

    @router.post("/ui/logout")
    def logout(request: Request) -> Response:
        reason = sessions.foreign(request)
        if reason is not None:
            current = auth.session(request)
            notice = f"Not signed out: {reason}."
            return page(auth, request, target="/ui", status=403, notice=notice, signed_in=current)
        response = RedirectResponse("/ui/login", status_code=303)
        sessions.end(response, request)
        return browser.protect(response, request, sessions, None)

    return router


async def _posted(request: Request) -> dict[str, str]:
    """The sign-in form's fields; none when the body is not a form."""
    kind = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if kind != "application/x-www-form-urlencoded":
        return {}
    try:
        pairs = parse_qsl((await request.body()).decode("utf-8"), keep_blank_values=True, max_num_fields=8)
    except (UnicodeDecodeError, ValueError):
        return {}
    return {name: value for name, value in pairs if name in _FIELDS}
