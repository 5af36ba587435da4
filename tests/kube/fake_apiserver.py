"""A fake Kubernetes API server on loopback, for the reconciler's tests only (test
infrastructure: the product never uses it). It speaks the real protocol for what the reconciler
asks, so that the official ``kubernetes`` client drives it unchanged:

- list: ``GET /api/v1/pods|namespaces|resourcequotas?limit=&continue=``, items in pages with
  ``metadata.continue`` and the list's ``metadata.resourceVersion``;
- watch: the same with ``watch=true``, ``resourceVersion``, ``allowWatchBookmarks`` and
  ``timeoutSeconds``: a chunked stream of JSON lines ``{"type": ADDED|MODIFIED|DELETED|BOOKMARK|
  ERROR, "object": ...}`` with increasing resourceVersions; a version older than the oldest kept
  (:meth:`FakeApiServer.compact`) is answered with an ERROR event holding a Status of code 410;
- leases: ``GET``/``PUT`` ``/apis/coordination.k8s.io/v1/namespaces/NS/leases/NAME`` and
  ``POST .../leases``, with 404, and 409 on a stale resourceVersion or an existing name;
- ``PATCH /api/v1/namespaces/NS/resourcequotas/NAME/status`` (a merge patch; an object sent as
  a JSON patch is refused, as the API server refuses it).

Faults for the tests: events applied but never sent to watchers (``deliver=False``), watches
cut mid-stream (:meth:`FakeApiServer.drop_watches`), history compacted (410 Gone).
"""

from __future__ import annotations

import base64
import copy
import json
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

KINDS = {"pods": "Pod", "namespaces": "Namespace", "resourcequotas": "ResourceQuota", "leases": "Lease"}
LIST_PATH = {f"/api/v1/{k}": k for k in ("pods", "namespaces", "resourcequotas")}


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


class FakeApiServer:
    """The store, its history of events, and the HTTP server in front of them."""

    def __init__(self, bookmark_every: float = 0.5) -> None:
        self.bookmark_every = bookmark_every
        self.lock = threading.Condition()
        self.rv = 100
        #: kind -> "ns/name" -> object
        self.objects: dict[str, dict[str, dict[str, Any]]] = {k: {} for k in KINDS}
        #: (rv, kind, type, object) of every change sent to watchers
        self.events: list[tuple[int, str, str, dict[str, Any]]] = []
        #: watches from a version below this are 410 Gone: the events after it are all kept
        self.oldest = 0
        self._drop = 0
        self.watches_served = 0
        self.requests: list[str] = []
        self.server = _Server(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FakeApiServer:
        self.thread.start()
        return self

    def close(self) -> None:
        self.drop_watches()
        self.server.shutdown()
        self.server.server_close()

    # -- the tests' side ----------------------------------------------------------------------
    def create(self, kind: str, obj: dict[str, Any], *, deliver: bool = True) -> dict[str, Any]:
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", "2026-01-01T00:00:00Z")
        obj.setdefault("apiVersion", "coordination.k8s.io/v1" if kind == "leases" else "v1")
        obj.setdefault("kind", KINDS[kind])
        with self.lock:
            if _key(obj) in self.objects[kind]:
                raise KeyError(_key(obj))
            return self._put(kind, obj, "ADDED", deliver)

    def update(self, kind: str, obj: dict[str, Any], *, deliver: bool = True) -> dict[str, Any]:
        with self.lock:
            return self._put(kind, copy.deepcopy(obj), "MODIFIED", deliver)

    def delete(self, kind: str, namespace: str | None, name: str, *, deliver: bool = True) -> None:
        with self.lock:
            obj = self.objects[kind].pop(f"{namespace or ''}/{name}")
            self.rv += 1
            obj["metadata"]["resourceVersion"] = str(self.rv)
            if deliver:
                self.events.append((self.rv, kind, "DELETED", copy.deepcopy(obj)))
            self.lock.notify_all()

    def get(self, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        with self.lock:
            found = self.objects[kind].get(f"{namespace or ''}/{name}")
            return copy.deepcopy(found) if found else None

    def items(self, kind: str) -> list[dict[str, Any]]:
        with self.lock:
            return [copy.deepcopy(o) for o in self.objects[kind].values()]

    def compact(self) -> None:
        """Forget the history: every watch resuming from an older version gets 410 Gone."""
        with self.lock:
            self.oldest = self.rv  # the history after this version is kept (none yet)
            self.events.clear()

    def drop_watches(self) -> None:
        """Cut every open watch mid-stream, without the stream's last chunk."""
        with self.lock:
            self._drop += 1
            self.lock.notify_all()

    # -- the store ----------------------------------------------------------------------------
    def _put(self, kind: str, obj: dict[str, Any], kind_of_event: str, deliver: bool) -> dict[str, Any]:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self.objects[kind][_key(obj)] = obj
        if deliver:
            self.events.append((self.rv, kind, kind_of_event, copy.deepcopy(obj)))
        self.lock.notify_all()
        return copy.deepcopy(obj)


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that hung up (a watch stopped, a test ending) is not an error here


def _key(obj: dict[str, Any]) -> str:
    meta = obj["metadata"]
    return f"{meta.get('namespace') or ''}/{meta['name']}"


def _handler(api: FakeApiServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _send(self, code: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> dict[str, Any]:
            length = int(self.headers.get("Content-Length") or 0)
            found: dict[str, Any] = json.loads(self.rfile.read(length) or b"{}")
            return found

        def do_GET(self) -> None:
            url = urlparse(self.path)
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            api.requests.append(f"GET {self.path}")
            if url.path in LIST_PATH:
                kind = LIST_PATH[url.path]
                if query.get("watch") in ("1", "true"):
                    self._watch(kind, query)
                else:
                    self._list(kind, query)
                return
            parts = url.path.strip("/").split("/")
            if parts[:3] == ["apis", "coordination.k8s.io", "v1"] and len(parts) == 7:
                found = api.get("leases", parts[4], parts[6])
                if found is None:
                    self._send(404, _status(404, "NotFound", f'leases "{parts[6]}" not found'))
                else:
                    self._send(200, found)
                return
            self._send(404, _status(404, "NotFound", url.path))

        def do_POST(self) -> None:
            parts = urlparse(self.path).path.strip("/").split("/")
            api.requests.append(f"POST {self.path}")
            body = self._body()
            body.setdefault("metadata", {})["namespace"] = parts[4]
            try:
                self._send(201, api.create("leases", body))
            except KeyError:
                self._send(409, _status(409, "AlreadyExists", "lease exists"))

        def do_PUT(self) -> None:
            parts = urlparse(self.path).path.strip("/").split("/")
            api.requests.append(f"PUT {self.path}")
            body = self._body()
            with api.lock:
                current = api.objects["leases"].get(f"{parts[4]}/{parts[6]}")
                if current is None:
                    self._send(404, _status(404, "NotFound", "no lease"))
                    return
                given = (body.get("metadata") or {}).get("resourceVersion")
                if given != current["metadata"]["resourceVersion"]:
                    self._send(409, _status(409, "Conflict", "the object has been modified"))
                    return
                body["metadata"] = {**current["metadata"], "resourceVersion": given}
                self._send(200, api._put("leases", body, "MODIFIED", True))

        def do_PATCH(self) -> None:
            parts = urlparse(self.path).path.strip("/").split("/")
            api.requests.append(f"PATCH {self.path}")
            patch = self._body()
            kind = self.headers.get("Content-Type", "")
            if kind not in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
                # a JSON patch is a list of operations: an object under that type is refused
                self._send(
                    415 if "patch" not in kind else 400,
                    _status(400, "BadRequest", f"not a merge patch: {kind}"),
                )
                return
            with api.lock:
                current = api.objects["resourcequotas"].get(f"{parts[3]}/{parts[5]}")
                if current is None or parts[-1] != "status":
                    self._send(404, _status(404, "NotFound", "no such resourcequota"))
                    return
                updated = copy.deepcopy(current)
                _merge(updated, {"status": patch.get("status") or {}})
                self._send(200, api._put("resourcequotas", updated, "MODIFIED", True))

        def _list(self, kind: str, query: dict[str, str]) -> None:
            limit = int(query.get("limit") or 0)
            if token := query.get("continue"):
                state = json.loads(base64.b64decode(token))
                rv, start, items = state["rv"], state["start"], state["items"]
            else:
                with api.lock:
                    rv = api.rv
                    items = sorted(api.objects[kind])
                start = 0
            end = start + limit if limit else len(items)
            with api.lock:
                page = [
                    copy.deepcopy(api.objects[kind][k]) for k in items[start:end] if k in api.objects[kind]
                ]
            meta: dict[str, Any] = {"resourceVersion": str(rv)}
            if end < len(items):
                meta["continue"] = base64.b64encode(
                    json.dumps({"rv": rv, "start": end, "items": items}).encode()
                ).decode()
            self._send(
                200, {"kind": f"{KINDS[kind]}List", "apiVersion": "v1", "metadata": meta, "items": page}
            )

        def _chunk(self, event: dict[str, Any]) -> None:
            data = json.dumps(event).encode() + b"\n"
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def _watch(self, kind: str, query: dict[str, str]) -> None:
            since = int(query.get("resourceVersion") or 0)
            timeout = float(query.get("timeoutSeconds") or 30)
            bookmarks = query.get("allowWatchBookmarks") in ("1", "true")
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            api.watches_served += 1
            deadline = time.monotonic() + timeout
            next_bookmark = time.monotonic() + api.bookmark_every
            with api.lock:
                drops = api._drop
            try:
                if since < api.oldest:
                    self._chunk(
                        {
                            "type": "ERROR",
                            "object": _status(
                                410, "Expired", f"too old resource version: {since} ({api.oldest})"
                            ),
                        }
                    )
                else:
                    while True:
                        with api.lock:
                            if api._drop != drops:
                                self.connection.shutdown(socket.SHUT_RDWR)
                                return
                            if since < api.oldest:
                                pending: list[dict[str, Any]] = [
                                    {
                                        "type": "ERROR",
                                        "object": _status(410, "Expired", "too old resource version"),
                                    }
                                ]
                            else:
                                pending = [
                                    {"type": t, "object": o}
                                    for rv, k, t, o in api.events
                                    if k == kind and rv > since
                                ]
                                if pending:
                                    since = int(pending[-1]["object"]["metadata"]["resourceVersion"])
                            now = time.monotonic()
                            if not pending and bookmarks and now >= next_bookmark:
                                pending = [
                                    {
                                        "type": "BOOKMARK",
                                        "object": {
                                            "kind": KINDS[kind],
                                            "apiVersion": "v1",
                                            "metadata": {"resourceVersion": str(api.rv)},
                                        },
                                    }
                                ]
                                since = max(since, api.rv)
                                next_bookmark = now + api.bookmark_every
                            if not pending:
                                if now >= deadline:
                                    break
                                api.lock.wait(min(0.1, deadline - now))
                                continue
                        for event in pending:
                            self._chunk(event)
                        if pending[0]["type"] == "ERROR":
                            break
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError, OSError):
                return

    return Handler


def _merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        elif value is None:
            target.pop(key, None)
        else:
            target[key] = value


@contextmanager
def running(bookmark_every: float = 0.5) -> Iterator[FakeApiServer]:
    """A fake API server for the length of a block."""
    api = FakeApiServer(bookmark_every).start()
    try:
        yield api
    finally:
        api.close()
