"""The two kinds of caller the fault runs drive: the library in-process, and the HTTP service.

Both answer every call with a :class:`Reply` that says what the caller saw, so that the load,
the books and the report never need to know which one ran. A caller never raises.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from quota_ledger import (
    DatabaseUnavailable,
    OverQuota,
    QuotaEngine,
    QuotaLedgerError,
    Reservation,
    ReservationStateError,
)

# What a reply means to the caller.
OK = "ok"  # done; ``state`` is the reservation's state
REFUSED = "refused"  # over quota: nothing was reserved
STATE = "state"  # refused for the reservation's state (``state`` says which)
RETRY = "retry"  # the ledger is unavailable (DatabaseUnavailable, 503, service unreachable)
UNEXPECTED = "unexpected"  # a typed error that no fault should cause
UNTYPED = "untyped"  # not a QuotaLedgerError, or an HTTP 5xx other than 503
SERVED = (OK, REFUSED, STATE)


@dataclass(frozen=True)
class Reply:
    kind: str
    #: the error as the caller saw it (class name, or HTTP status and code); None on success
    error: str | None = None
    state: str | None = None
    reservation_id: str | None = None
    released: bool = False
    detail: str = ""


class Caller(Protocol):
    def reserve(self, queue: str, resources: dict[str, int], key: str, ttl: float) -> Reply: ...
    def commit(self, reservation_id: str) -> Reply: ...
    def rollback(self, reservation_id: str) -> Reply: ...
    def release(self, reservation_id: str) -> Reply: ...
    def sweep(self) -> Reply: ...
    def close(self) -> None: ...


class LibraryCaller:
    """Calls a :class:`QuotaEngine` shared by every worker of a run."""

    def __init__(self, engine: QuotaEngine) -> None:
        self.engine = engine

    def reserve(self, queue: str, resources: dict[str, int], key: str, ttl: float) -> Reply:
        return self._call(lambda: self.engine.reserve(queue, resources, key=key, ttl=ttl))

    def commit(self, reservation_id: str) -> Reply:
        return self._call(lambda: self.engine.commit(reservation_id))

    def rollback(self, reservation_id: str) -> Reply:
        return self._call(lambda: self.engine.rollback(reservation_id))

    def release(self, reservation_id: str) -> Reply:
        return self._call(lambda: self.engine.release_reservation(reservation_id))

    def sweep(self) -> Reply:
        return self._call(lambda: self.engine.expire(batch_size=50, max_batches=2))

    def close(self) -> None:
        """The engine belongs to the run, not to one caller."""

    @staticmethod
    def _call(call: Any) -> Reply:
        try:
            done = call()
        except OverQuota as error:
            return Reply(REFUSED, error=type(error).__name__)
        except ReservationStateError as error:
            return Reply(STATE, error=type(error).__name__, state=error.state.value)
        except DatabaseUnavailable as error:
            return Reply(RETRY, error=type(error).__name__, detail=str(error))
        except QuotaLedgerError as error:
            return Reply(UNEXPECTED, error=type(error).__name__, detail=str(error))
        except Exception as error:  # the very thing these runs look for
            return Reply(UNTYPED, error=f"{type(error).__module__}.{type(error).__name__}", detail=str(error))
        if isinstance(done, Reservation):
            return Reply(
                OK, state=done.state.value, reservation_id=done.id, released=done.released_at is not None
            )
        return Reply(OK)


class HttpCaller:
    """Calls the service over HTTP with a bearer token, one connection pool per worker."""

    def __init__(self, base: str, token: str) -> None:
        self.client = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=60)

    def reserve(self, queue: str, resources: dict[str, int], key: str, ttl: float) -> Reply:
        body = {"queue": queue, "resources": resources, "key": key, "ttl": ttl}
        return self._call("POST", "/v1/reservations", body)

    def commit(self, reservation_id: str) -> Reply:
        return self._call("POST", f"/v1/reservations/{reservation_id}/commit")

    def rollback(self, reservation_id: str) -> Reply:
        return self._call("POST", f"/v1/reservations/{reservation_id}/rollback")

    def release(self, reservation_id: str) -> Reply:
        return self._call("POST", f"/v1/reservations/{reservation_id}/release")

    def sweep(self) -> Reply:
        # The service sweeps by itself; a caller reads a queue's usage instead.
        return self._call("GET", "/v1/queues/root/usage")

    def close(self) -> None:
        self.client.close()

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Reply:
        try:
            answer = self.client.request(method, path, json=body)
        except httpx.TransportError as error:
            # The service is down or restarting: the request may or may not have been served.
            return Reply(RETRY, error="service unreachable", detail=type(error).__name__)
        status = answer.status_code
        try:
            data = answer.json()
        except ValueError:
            data = {}
        if status < 300:
            return Reply(
                OK,
                state=data.get("state"),
                reservation_id=data.get("id"),
                released=data.get("released_at") is not None,
            )
        problem = data.get("error", {}) if isinstance(data, dict) else {}
        code = problem.get("code", "?")
        seen = f"HTTP {status} {code}"
        if status == 503:
            if answer.headers.get("retry-after") is None:
                return Reply(UNTYPED, error=f"{seen} without Retry-After")
            return Reply(RETRY, error=seen)
        if status >= 500:
            return Reply(UNTYPED, error=seen, detail=answer.text[:200])
        if code == "over_quota":
            return Reply(REFUSED, error=seen)
        if code == "invalid_state":
            return Reply(STATE, error=seen, state=problem.get("details", {}).get("state"))
        return Reply(UNEXPECTED, error=seen, detail=answer.text[:200])
