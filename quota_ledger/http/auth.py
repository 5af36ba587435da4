"""Bearer-token authentication and role checks.

401 when the token is missing or unknown, 403 when its role is too low or the request is outside
its partition and queue subtree. Verified tokens are cached for a few seconds (a revoked token
stops working within ``token_cache_seconds``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Awaitable, Callable

from fastapi import HTTPException, Request
from starlette.concurrency import run_in_threadpool

from quota_ledger.engine import QuotaEngine
from quota_ledger.http.browser import OWN_FETCH, Sessions
from quota_ledger.runtime import tokens
from quota_ledger.runtime.tokens import Token

_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="quota-ledger"'}
#: characters of a token a form or a cookie may present (issued ones are far shorter)
MAX_TOKEN = 200


class Authenticator:
    def __init__(self, engine: QuotaEngine, cache_seconds: float, sessions: Sessions | None = None) -> None:
        self.engine = engine
        self.cache_seconds = cache_seconds
        self.sessions = sessions or Sessions()
        self._cache: dict[str, tuple[float, Token | None]] = {}
        self._lock = threading.Lock()

    def token_of(self, request: Request) -> Token:
        found = self.lookup(self._presented(request))
        if found is None:
            raise HTTPException(401, "unknown or revoked token", headers=_CHALLENGE)
        return found

    def page_token(self, request: Request) -> Token | None:
        """The token of a page a browser opens (its session cookie, or an ``Authorization``
        header), None when it has no valid one. A token in the address never counts."""
        try:
            value = self._presented(request)
        except HTTPException:
            return None
        found = self.lookup(value)
        if found is not None:
            request.state.token = found  # for the access log
        return found

    def session(self, request: Request) -> Token | None:
        """The token of the browser's session cookie, whatever the request (a sign-in or sign-out
        form asks who is signed in; it authorizes nothing by this)."""
        value = self.sessions.held(request)
        return self.lookup(value) if 0 < len(value) <= MAX_TOKEN else None

    def _presented(self, request: Request) -> str:
        header = request.headers.get("authorization", "")
        scheme, _, value = header.partition(" ")
        if scheme.lower() != "bearer" or not value:
            value = cookie_token(request, self.sessions)
        if not value:
            raise HTTPException(401, "a bearer token is required", headers=_CHALLENGE)
        return value.strip()

    def cached(self, value: str) -> tuple[bool, Token | None]:
        """(hit, token) from the cache alone, without the database."""
        with self._lock:
            entry = self._cache.get(tokens.digest(value))
        if entry is not None and entry[0] > time.monotonic():
            return True, entry[1]
        return False, None

    def lookup(self, value: str) -> Token | None:
        hit, found = self.cached(value)
        if hit:
            return found
        now = time.monotonic()
        key = tokens.digest(value)
        found = tokens.verify(self.engine, value)
        with self._lock:
            if len(self._cache) > 10_000:
                self._cache.clear()
            self._cache[key] = (now + self.cache_seconds, found)
        return found

    def require(self, role: str) -> Callable[[Request], Awaitable[Token]]:
        async def dependency(request: Request) -> Token:
            # On the event loop when the token is cached (no thread hop); the database is asked
            # from a worker thread otherwise.
            value = self._presented(request)
            hit, token = self.cached(value)
            if not hit:
                token = await run_in_threadpool(self.lookup, value)
            if token is None:
                raise HTTPException(401, "unknown or revoked token", headers=_CHALLENGE)
            if not token.allows(role):
                raise HTTPException(403, f"this needs the {role} role; the token has {token.role}")
            request.state.token = token
            return token

        dependency.__name__ = f"require_{role}"
        return dependency


#: what a browser's cookie may do: read, never change anything
_SAFE_METHODS = frozenset({"GET", "HEAD"})


def cookie_token(request: Request, sessions: Sessions) -> str:
    """The session cookie's token, when it may authenticate ``request``; else "".

    A browser sends the cookie with whatever request another page makes it send: a form posted
    from a page on another port of the same host is same-site, and ``SameSite`` does not stop it.
    So the cookie authorizes safe reads only, and only those the service's own pages (or the
    user) made: ``Sec-Fetch-Site`` same-origin or none, and an ``Origin``, if any, of this host.
    Everything else needs the ``Authorization`` header, which no other page can make a browser
    send.
    """
    value = sessions.held(request)
    if not value or request.method not in _SAFE_METHODS:
        return ""
    fetch_site = request.headers.get("sec-fetch-site")
    if fetch_site is not None and fetch_site.lower() not in OWN_FETCH:
        return ""
    origin = request.headers.get("origin")
    if origin is not None and origin != sessions.origin(request):
        return ""
    return value


def check_scope(token: Token, partition: str | None, queue: str | None) -> None:
    """403 unless the request lies inside the token's partition and queue subtree."""
    if not token.covers(partition, queue):
        where = f"partition {token.partition or '*'}, queue {token.queue or '*'}"
        raise HTTPException(403, f"the token is restricted to {where}")
