"""Bearer-token authentication and role checks.

401 when the token is missing or unknown, 403 when its role is too low or the request is outside
its partition and queue subtree. Verified tokens are cached for a few seconds (a revoked token
stops working within ``token_cache_seconds``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from fastapi import HTTPException, Request

from quota_ledger import tokens
from quota_ledger.engine import QuotaEngine
from quota_ledger.tokens import Token

_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="quota-ledger"'}


class Authenticator:
    def __init__(self, engine: QuotaEngine, cache_seconds: float) -> None:
        self.engine = engine
        self.cache_seconds = cache_seconds
        self._cache: dict[str, tuple[float, Token | None]] = {}
        self._lock = threading.Lock()

    def token_of(self, request: Request) -> Token:
        header = request.headers.get("authorization", "")
        scheme, _, value = header.partition(" ")
        if scheme.lower() != "bearer" or not value:
            value = request.cookies.get("quota_ledger_token", "")
        if not value:
            raise HTTPException(401, "a bearer token is required", headers=_CHALLENGE)
        found = self.lookup(value.strip())
        if found is None:
            raise HTTPException(401, "unknown or revoked token", headers=_CHALLENGE)
        return found

    def lookup(self, value: str) -> Token | None:
        now = time.monotonic()
        key = tokens.digest(value)
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None and cached[0] > now:
                return cached[1]
        found = tokens.verify(self.engine, value)
        with self._lock:
            if len(self._cache) > 10_000:
                self._cache.clear()
            self._cache[key] = (now + self.cache_seconds, found)
        return found

    def require(self, role: str) -> Callable[[Request], Token]:
        def dependency(request: Request) -> Token:
            token = self.token_of(request)
            if not token.allows(role):
                raise HTTPException(403, f"this needs the {role} role; the token has {token.role}")
            request.state.token = token
            return token

        dependency.__name__ = f"require_{role}"
        return dependency


def check_scope(token: Token, partition: str | None, queue: str | None) -> None:
    """403 unless the request lies inside the token's partition and queue subtree."""
    if not token.covers(partition, queue):
        where = f"partition {token.partition or '*'}, queue {token.queue or '*'}"
        raise HTTPException(403, f"the token is restricted to {where}")
