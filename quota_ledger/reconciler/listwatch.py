"""The list/watch loop of one kind of object, as client-go's reflector runs it.

List (in pages), hand the whole list to the handler, then watch from the list's
``resourceVersion`` with bookmarks (``allowWatchBookmarks``) so that the version stays fresh on a
quiet kind. A watch that ends (its ``timeoutSeconds``, a dropped connection, an error) is resumed
from the last version seen; ``410 Gone`` (the version is older than the API server keeps) and a
failed event (the ledger could not take it) are followed by a full relist, as is every
``relist_every`` seconds. A periodic relist, or one after a failed event, watches on from the
version the watch had reached, so that the events in between are not skipped; after 410 Gone
the watch starts from the list's version. The handler's events are applied in the order the API
server sent them.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any, Protocol

import urllib3
from kubernetes import watch
from kubernetes.client.exceptions import ApiException

from quota_ledger.reconciler.metrics import Metrics

log = logging.getLogger("quota_ledger.reconciler")

#: HTTP 410 Gone: the resourceVersion asked for is no longer kept
GONE = 410


class Handler(Protocol):
    """The ledger's side of one kind."""

    def relisted(self, items: list[dict[str, Any]], listed_at: datetime) -> None:
        """The complete list of the kind's objects, as of ``listed_at`` (when the list began)."""

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        """One watch event: ``ADDED``, ``MODIFIED`` or ``DELETED`` of ``obj``."""


class _RawWatch(watch.Watch):
    """A watch that hands over the objects as the API server sent them (dicts), unconverted."""

    def get_return_type(self, func: Any) -> None:
        return None


class ListWatch:
    """Lists and watches one kind through ``list_call`` (a ``list_*`` method of the client)
    until ``stop`` is set."""

    def __init__(
        self,
        kind: str,
        list_call: Callable[..., Any],
        handler: Handler,
        metrics: Metrics,
        *,
        relist_every: float,
        watch_timeout: float = 300.0,
        page_size: int = 500,
        backoff: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kind = kind
        self.list_call = list_call
        self.handler = handler
        self.metrics = metrics
        self.relist_every = relist_every
        self.watch_timeout = watch_timeout
        self.page_size = page_size
        self.backoff = backoff
        self.clock = clock
        #: the version of the last list, event or bookmark
        self.resource_version: str | None = None
        #: the current watch (the client leaves it untyped)
        self._watch: Any = None
        self._lock = threading.Lock()
        #: set once the first list has been handed over
        self.synced = threading.Event()

    def run(self, stop: threading.Event) -> None:
        """List and watch until ``stop`` is set (:meth:`interrupt` ends a watch at once)."""
        reason = "start"
        due = 0.0
        while not stop.is_set():
            try:
                if reason:
                    # A relist that is not forced by 410 Gone keeps watching from where the watch
                    # was: the events since then are replayed (charging and releasing are
                    # idempotent), so a pod created and deleted in between is not missed.
                    resume = self.resource_version if reason in ("periodic", "recovery") else None
                    self._relist(reason)
                    if resume is not None:
                        self.resource_version = resume
                    due = self.clock() + self.relist_every
                    reason = ""
                remaining = due - self.clock()
                if remaining <= 0:
                    reason = "periodic"
                    continue
                ended = self._watch_once(stop, remaining)
                if ended == "gone":
                    reason = "gone"
                elif ended and not stop.is_set():
                    self.metrics.watch_restarts.labels(self.kind, ended).inc()
            except ApiException as error:
                if error.status == GONE:
                    reason = "gone"
                    continue
                reason = self._failed(stop, "api", error)
            except Exception as error:  # a dropped connection, the database: relist after a pause
                reason = self._failed(stop, "error", error)

    def interrupt(self) -> None:
        """End the current watch now (the loop then sees ``stop``)."""
        with self._lock:
            if self._watch is not None:
                self._watch.stop()

    def _failed(self, stop: threading.Event, why: str, error: Exception) -> str:
        if stop.is_set():
            return ""
        log.warning("reconciler: %s list/watch failed (%s), relisting: %s", self.kind, why, error)
        self.metrics.watch_restarts.labels(self.kind, why).inc()
        stop.wait(self.backoff)
        return "recovery"

    def _relist(self, reason: str) -> None:
        items: list[dict[str, Any]] = []
        token: str | None = None
        listed_at = datetime.now(UTC)
        while True:
            kwargs: dict[str, Any] = {"limit": self.page_size, "_preload_content": False}
            if token:
                kwargs["_continue"] = token
            page = json.loads(self.list_call(**kwargs).data)
            items += page.get("items") or []
            meta = page.get("metadata") or {}
            token = meta.get("continue")
            if not token:
                break
        self.resource_version = meta.get("resourceVersion")
        self.handler.relisted(items, listed_at)
        self.synced.set()
        self.metrics.relists.labels(self.kind, reason).inc()
        log.info(
            "reconciler: %s listed (%s): %d at version %s",
            self.kind,
            reason,
            len(items),
            self.resource_version,
        )

    def _watch_once(self, stop: threading.Event, remaining: float) -> str:
        """One watch from :attr:`resource_version`; why it ended: ``gone`` (410), ``timeout``
        (its time is up), ``dropped`` (the stream ended early), or ``""`` (stopped)."""
        timeout = max(1, int(min(self.watch_timeout, remaining)))
        with self._lock:
            self._watch = current = _new_watch()
            stream = current.stream(
                self.list_call,
                resource_version=self.resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=timeout,
                _request_timeout=(10, timeout + 30),
            )
        started = self.clock()
        try:
            for event in _until_dropped(stream):
                if stop.is_set():
                    return ""
                kind = event.get("type")
                obj = event.get("raw_object") or {}
                if kind == "ERROR":
                    if obj.get("code") == GONE:
                        return "gone"
                    raise ApiException(status=obj.get("code"), reason=obj.get("message"))
                version = (obj.get("metadata") or {}).get("resourceVersion")
                if kind != "BOOKMARK":
                    self.handler.event(str(kind), obj)
                if version:
                    self.resource_version = version
        finally:
            with self._lock:
                self._watch = None
        if stop.is_set():
            return ""
        return "timeout" if self.clock() - started >= timeout - 0.5 else "dropped"


def _new_watch() -> Any:
    return _RawWatch()  # type: ignore[no-untyped-call]


def _until_dropped(stream: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """The stream's events until it ends, or until its connection breaks (then it is resumed
    from the last version, as a watch that ended)."""
    try:
        yield from stream
    except (urllib3.exceptions.HTTPError, OSError) as error:
        log.info("reconciler: watch dropped: %s", error)
