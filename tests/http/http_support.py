"""Helpers shared by the HTTP tests."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import httpx
import uvicorn

from quota_ledger import QuotaEngine


@dataclass
class Service:
    base: str
    engine: QuotaEngine
    tokens: dict[str, str]

    def client(self, role: str | None = "admin", **headers: str) -> httpx.Client:
        if role is not None:
            headers.setdefault("Authorization", f"Bearer {self.tokens[role]}")
        return httpx.Client(base_url=self.base, headers=headers, timeout=30)


def sign_in(client: httpx.Client, token: str, target: str = "/ui") -> httpx.Response:
    """Sign ``client`` in as a browser does: open the form, post it with its nonce."""
    form = client.get("/ui/login", params={"next": target})
    nonce = re.search(r"name=nonce value='([^']+)'", form.text)
    assert nonce, form.text[:500]
    return client.post(
        "/ui/login",
        data={"token": token, "next": target, "nonce": nonce.group(1)},
        headers={
            "Origin": client.base_url.scheme + "://" + client.base_url.netloc.decode(),
            "Sec-Fetch-Site": "same-origin",
        },
    )


@contextmanager
def in_thread(config: uvicorn.Config) -> Iterator[int]:
    """uvicorn with ``config`` in a thread of its own: the port it listens on, while the block
    runs; stopped after."""
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield server.servers[0].sockets[0].getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(timeout=30)
