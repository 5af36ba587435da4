"""The HTTP/1.1 connection: uvicorn's httptools protocol, with bounded request heads.

A client that sends its head slowly, or nothing at all, holds a connection and a parser: one
whose head is not complete ``header_timeout`` seconds after its connection or its request began
is answered 408 and closed. (uvicorn itself bounds the time between requests,
``timeout_keep_alive``, and the connections served at once, ``limit_concurrency``: see
:func:`uvicorn_options`.)

httptools keeps a request's head (request line and headers) in memory until it is complete,
and builds each header value by appending to it: one header of tens of megabytes takes seconds
of the event loop from every other client, and nothing bounds it. Here a head longer than
``max_header_bytes``, or with more than ``max_headers`` headers, is answered 431 and its
connection closed before the application sees it. Bytes are counted as they arrive (at most
one socket read, 256 KiB, past the bound), so no head is ever read whole.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from quota_ledger.runtime.settings import Settings

_REASON = b"Request Header Fields Too Large"


class BoundedHttp(HttpToolsProtocol):
    """uvicorn's httptools protocol, refusing request heads over the bounds with 431."""

    max_header_bytes: ClassVar[int] = Settings.model_fields["max_header_bytes"].default
    max_headers: ClassVar[int] = Settings.model_fields["max_headers"].default
    header_timeout: ClassVar[float] = Settings.model_fields["header_timeout"].default

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: reading a request's head; since when (False: the head began in the last chunk read)
        self._in_head = False
        self._counting = False
        #: bytes of the head's chunks, and of what the parser handed over of it
        self._head_bytes = 0
        self._head_size = 0
        self._header_count = 0
        self._refusal: str | None = None
        self._head_timer: asyncio.TimerHandle | None = None
        #: the subject of the client certificate the TLS handshake verified, if any
        self._client_cert: str | None = None

    @classmethod
    def configure(cls, settings: Settings) -> None:
        """Take the bounds of ``settings`` (the app factory of each worker process calls it)."""
        cls.max_header_bytes = settings.max_header_bytes
        cls.max_headers = settings.max_headers
        cls.header_timeout = settings.header_timeout

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._client_cert = verified_client(transport)
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refusal is not None:
            return
        super().data_received(data)
        if not self._in_head or self._refusal is not None:
            return
        # A head still incomplete after this chunk: httptools holds it. The chunk it began in is
        # not counted (the parser's own count below bounds a head that ends in it).
        if self._counting:
            self._head_bytes += len(data)
        self._counting = True
        if self._head_bytes > self.max_header_bytes:
            self._refuse(self._too_long())

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._client_cert is not None:
            # The ASGI TLS extension's key: who the verified client certificate names.
            tls: dict[object, object] = {"client_cert_name": self._client_cert, "client_cert_error": None}
            self.scope["extensions"] = {"tls": tls}
        self._arm_head_timer()
        self._in_head, self._counting = True, False
        self._head_bytes = self._head_size = self._header_count = 0

    def on_url(self, url: bytes) -> None:
        self._head_size += len(url)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        self._head_size += len(name) + len(value) + 4
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._disarm_head_timer()
        if self._header_count > self.max_headers:
            self._refusal = f"the request has more than {self.max_headers} headers"
        elif self._head_size > self.max_header_bytes:
            self._refusal = self._too_long()
        if self._refusal is not None:
            raise _Refused  # stops the parser: the request never reaches the application
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._disarm_head_timer()  # uvicorn's keep-alive timeout takes over until the next head

    def _arm_head_timer(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.header_timeout, self._head_timed_out)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or (self.cycle is not None and not self.cycle.response_complete):
            return  # a request is being served: its head came in time
        if self._in_head:
            self._refusal = f"the request's head did not arrive within {self.header_timeout:g} s"
            self._send_error(408, b"Request Timeout", self._refusal)
        else:
            self.transport.close()  # nothing was sent

    def _too_long(self) -> str:
        return f"the request's head is over {self.max_header_bytes} bytes"

    def send_400_response(self, msg: str) -> None:
        if self._refusal is not None:  # the parser stopped at our refusal
            self._send_431(self._refusal)
            return
        super().send_400_response(msg)

    def _refuse(self, message: str) -> None:
        self._refusal = message
        self._send_431(message)

    def _send_431(self, message: str) -> None:
        self._send_error(431, _REASON, message)

    def _send_error(self, status: int, reason: bytes, message: str) -> None:
        self._disarm_head_timer()
        body = json.dumps({"error": {"code": "invalid_request", "message": message}}).encode()
        head = [b"HTTP/1.1 " + str(status).encode("ascii") + b" " + reason + b"\r\n"]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head += [
            b"content-type: application/json\r\n",
            b"content-length: " + str(len(body)).encode("ascii") + b"\r\n",
            b"connection: close\r\n\r\n",
        ]
        self.logger.warning("refused a request: %s", message)
        self.transport.write(b"".join(head) + body)
        self.transport.close()


class _Refused(Exception):
    """Raised in a parser callback to stop it; httptools hands it on as a parser error."""


def verified_client(transport: asyncio.BaseTransport) -> str | None:
    """The subject (``CN=...``) of the certificate the client presented and the handshake
    verified against ``tls_client_ca``; None without TLS or without a client certificate.
    (A certificate that fails verification fails the handshake: it never gets here.)"""
    found = transport.get_extra_info("ssl_object")
    if not isinstance(found, ssl.SSLObject | ssl.SSLSocket):
        return None
    cert = found.getpeercert()
    if not cert:
        return None
    subject = cert.get("subject", ())
    parts = [
        f"{pair[0]}={pair[1]}"
        for rdn in (subject if isinstance(subject, tuple) else ())
        for pair in rdn
        if isinstance(pair, tuple) and len(pair) == 2
    ]
    return ",".join(parts) or "unnamed"


def bounded(settings: Settings) -> type[BoundedHttp]:
    """The protocol class of one service process, with the bounds of ``settings``."""
    bounds = {
        "max_header_bytes": settings.max_header_bytes,
        "max_headers": settings.max_headers,
        "header_timeout": settings.header_timeout,
    }
    return type("BoundedHttp", (BoundedHttp,), bounds)


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """uvicorn's own bounds, from ``settings``: the time a connection may wait between requests,
    the connections served at once (beyond them a request is answered 503), and the proxies
    whose forwarded headers are believed (none unless configured: any other client could name
    any address in them), and with ``tls_client_ca`` the CA that client certificates are
    verified against (optional: clients without one still present tokens)."""
    proxies = [each.strip() for each in settings.trusted_proxies.split(",") if each.strip()]
    client_ca = {}
    if settings.tls_client_ca:
        client_ca = {"ssl_ca_certs": settings.tls_client_ca, "ssl_cert_reqs": ssl.CERT_OPTIONAL}
    return {
        "timeout_keep_alive": settings.keep_alive_timeout,
        "limit_concurrency": settings.max_connections,
        "proxy_headers": bool(proxies),
        "forwarded_allow_ips": proxies or None,
        **client_ca,
    }


__all__ = ["BoundedHttp", "bounded", "uvicorn_options", "verified_client"]
