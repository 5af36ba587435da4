"""What the service tells a browser: the session cookie, the security headers of its pages, and
whether a form was posted by one of its own pages.

The session cookie holds the token a person signed in with (``POST /ui/login``): HTTP-only,
``SameSite=Strict``, ``Path=/``, with a lifetime (``session_max_age``). When the browser reached
the service over TLS (its own certificate, ``X-Forwarded-Proto: https`` of a trusted proxy, or
``tls_at_proxy``) it is also ``Secure`` and named ``__Host-quota_ledger_token``: a page of another
host, or of this host over plain HTTP, cannot set a cookie of that name.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypeVar

from starlette.requests import Request
from starlette.responses import Response

COOKIE = "quota_ledger_token"
#: the sign-in form's nonce (double-submit: the form's hidden field must match it)
LOGIN_COOKIE = "quota_ledger_login"
_SECURE_PREFIX = "__Host-"
#: ``Sec-Fetch-Site`` values of a request the page itself (or the user, typing) made
OWN_FETCH = frozenset({"same-origin", "none"})
_NONCE = re.compile(r"[A-Za-z0-9_-]{22,64}")
#: where a sign-in may lead: the dashboard or the API docs, with a query; nothing else
_R = TypeVar("_R", bound=Response)
_NEXT = re.compile(r"/(?:ui|docs)(?:\?[A-Za-z0-9._~%&=+\-/]{0,1500})?")


@dataclass(frozen=True, kw_only=True, slots=True)
class Sessions:
    """How the session cookie is set, named and cleared."""

    max_age: int = 8 * 3600
    tls_at_proxy: bool = False

    def secure(self, request: Request) -> bool:
        """Whether the browser reached the service over TLS."""
        return self.tls_at_proxy or request.url.scheme == "https"

    def origin(self, request: Request) -> str:
        """This service's origin as the browser sees it."""
        scheme = "https" if self.secure(request) else request.url.scheme
        return f"{scheme}://{request.url.netloc}"

    def name(self, request: Request, base: str = COOKIE) -> str:
        return _SECURE_PREFIX + base if self.secure(request) else base

    def held(self, request: Request) -> str:
        """The session cookie's token, whatever the request ("" when none)."""
        return request.cookies.get(self.name(request), "").strip()

    def start(self, response: Response, request: Request, token: str) -> None:
        self._set(response, request, COOKIE, token, self.max_age)

    def end(self, response: Response, request: Request) -> None:
        self._set(response, request, COOKIE, "", 0)

    def nonce(self, request: Request) -> str | None:
        """The sign-in form's nonce the browser holds, when well formed."""
        value = request.cookies.get(self.name(request, LOGIN_COOKIE), "")
        return value if _NONCE.fullmatch(value) else None

    def set_nonce(self, response: Response, request: Request, value: str) -> None:
        """Give the browser the nonce a sign-in form carries (a session cookie)."""
        self._set(response, request, LOGIN_COOKIE, value, None)

    def nonce_matches(self, request: Request, posted: str) -> bool:
        held = self.nonce(request)
        return held is not None and hmac.compare_digest(held.encode(), posted.encode())

    def _set(self, response: Response, request: Request, base: str, value: str, max_age: int | None) -> None:
        response.set_cookie(
            self.name(request, base),
            value,
            max_age=max_age,
            path="/",
            secure=self.secure(request),
            httponly=True,
            samesite="strict",
        )

    def foreign(self, request: Request) -> str | None:
        """Why a form posted to this service did not come from one of its own pages; None when
        nothing says it did not.

        ``Sec-Fetch-Site`` is set by the browser and cannot be forged by a page. ``Origin: null``
        is what a page with ``Referrer-Policy: no-referrer`` (this service's own, too) sends with
        a form: it proves nothing either way, so a sign-in also needs its nonce.
        """
        site = request.headers.get("sec-fetch-site")
        if site is not None and site.lower() not in OWN_FETCH:
            return f"the form was sent from another site (Sec-Fetch-Site: {site})"
        origin = request.headers.get("origin")
        if origin is not None and origin != "null" and origin != self.origin(request):
            return "the form was sent from another site (its Origin is not this service)"
        return None


def new_nonce() -> str:
    return secrets.token_urlsafe(24)


def safe_next(value: str | None) -> str:
    """``value`` when it is a path of the dashboard or the API docs, else ``/ui``: a sign-in
    never leads to another host (``//host``, ``https://...``) or anywhere else."""
    if value and _NEXT.fullmatch(value):
        return value
    return "/ui"


def source_hash(content: str) -> str:
    """The CSP source expression that allows an inline script or style of exactly ``content``."""
    digest = hashlib.sha256(content.encode("utf-8")).digest()
    return f"'sha256-{base64.b64encode(digest).decode('ascii')}'"


def content_security_policy(*, scripts: Iterable[str] = (), styles: Iterable[str] = ()) -> str:
    """A policy that allows this service's own files and the inline ``scripts`` and ``styles``
    given, by hash: no other inline code, no ``style=`` attribute, no other host, no framing."""
    script_src = " ".join(["'self'", *(source_hash(s) for s in scripts)])
    style_src = " ".join(["'self'", *(source_hash(s) for s in styles)])
    return "; ".join(
        [
            "default-src 'self'",
            f"script-src {script_src}",
            f"style-src {style_src}",
            "img-src 'self' data:",
            "object-src 'none'",
            "base-uri 'none'",
            "form-action 'self'",
            "frame-ancestors 'none'",
        ]
    )


def protect(response: _R, request: Request, sessions: Sessions, policy: str | None) -> _R:
    """The headers of a page that carries or sets a session (``policy`` for an HTML page)."""
    if policy is not None:
        response.headers["Content-Security-Policy"] = policy
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["X-Frame-Options"] = "DENY"
    response.headers["Referrer-Policy"] = "no-referrer"
    response.headers["Cache-Control"] = "no-store"
    if sessions.secure(request):
        response.headers["Strict-Transport-Security"] = "max-age=31536000"
    return response
