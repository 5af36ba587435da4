"""One headless Chromium (Debian's ``chromium``) driven over the DevTools protocol.

Starting Chromium costs seconds; a page in a running one costs a fraction of one. The tests
open pages, read the DOM after the page's script ran, and take screenshots through it. Every page
records the Content-Security-Policy violations it meets (:meth:`Browser.violations`).
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from websockets.sync.client import ClientConnection, connect

#: run in every document before its own scripts (the page's CSP does not apply to it)
_RECORD_VIOLATIONS = """
window.__violations = [];
document.addEventListener("securitypolicyviolation", function (e) {
  window.__violations.push(e.violatedDirective + " " + e.blockedURI + " " + (e.sample || ""));
});
"""


class Browser:
    def __init__(self, width: int, height: int, *arguments: str) -> None:
        binary = shutil.which("chromium") or shutil.which("chromium-browser")
        assert binary, "Debian's chromium is needed for this test (scripts/test installs it as root)"
        self._home = tempfile.TemporaryDirectory(prefix="ql-chromium-")
        log = Path(self._home.name) / "stderr.log"
        with log.open("wb") as sink:  # a file, not a pipe: Chromium keeps writing to stderr
            self._process = subprocess.Popen(
                [
                    binary,
                    "--headless=new",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-dev-shm-usage",
                    "--hide-scrollbars",
                    "--no-first-run",
                    "--remote-debugging-port=0",
                    f"--user-data-dir={self._home.name}/profile",
                    *arguments,
                    "about:blank",
                ],
                stdout=subprocess.DEVNULL,
                stderr=sink,
                start_new_session=True,  # its helper processes in one group, stopped together
            )
        deadline = time.monotonic() + 60
        listening = re.compile(r"DevTools listening on (ws://\S+)")
        while (found := listening.search(log.read_text(errors="replace"))) is None:
            assert self._process.poll() is None, log.read_text(errors="replace")[-2000:]
            assert time.monotonic() < deadline, "Chromium did not start"
            time.sleep(0.05)
        self._closing = contextlib.ExitStack()
        self._socket: ClientConnection = self._closing.enter_context(
            connect(found.group(1), max_size=None, open_timeout=30)
        )
        self._ids = itertools.count(1)
        self._events: list[dict[str, Any]] = []
        target = self._call("Target.createTarget", {"url": "about:blank"})["targetId"]
        attached = self._call("Target.attachToTarget", {"targetId": target, "flatten": True})
        self._session = attached["sessionId"]
        self.call("Page.enable")
        self.call("Page.addScriptToEvaluateOnNewDocument", {"source": _RECORD_VIOLATIONS})
        self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )

    def _call(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> Any:
        number = next(self._ids)
        message: dict[str, Any] = {"id": number, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        self._socket.send(json.dumps(message))
        while True:
            reply = json.loads(self._socket.recv(timeout=60))
            if reply.get("id") == number:
                assert "error" not in reply, reply["error"]
                return reply.get("result", {})
            self._events.append(reply)

    def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        """A DevTools command in the page's session."""
        return self._call(method, params, self._session)

    def open(self, url: str) -> None:
        """Load ``url`` and wait for its load event (the page's script has run by then)."""
        self._events.clear()
        self.call("Page.navigate", {"url": url})
        self._loaded()

    def _loaded(self) -> None:
        deadline = time.monotonic() + 30
        while not any(e.get("method") == "Page.loadEventFired" for e in self._events):
            assert time.monotonic() < deadline, "the page did not load"
            self._events.append(json.loads(self._socket.recv(timeout=30)))

    def sign_in(self, base: str, token: str, target: str = "/ui") -> None:
        """Sign in on the service's form, as a person would, and land on ``target``."""
        self.open(f"{base}/ui/login?next={target}")
        if self.evaluate("!!document.getElementById('logout')"):  # signed in already: sign out
            self._events.clear()
            self.evaluate("document.getElementById('logout').submit()")
            self._loaded()
            self.open(f"{base}/ui/login?next={target}")
        self._events.clear()
        filled = self.evaluate(
            "(function (form) { if (!form) return false; form.elements.token.value = "
            f"{json.dumps(token)}; form.submit(); return true; }})(document.getElementById('login'))"
        )
        assert filled, self.dom()[-2000:]
        self._loaded()

    def violations(self) -> list[str]:
        """The Content-Security-Policy violations of the page shown."""
        return list(self.evaluate("window.__violations || []"))

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        return result["result"].get("value")

    def dom(self) -> str:
        """The document as it is now, after the page's script changed it."""
        return str(self.evaluate("document.documentElement.outerHTML"))

    def wait_for(self, expression: str, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.evaluate(expression):
                return True
            time.sleep(0.1)
        return False

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", {"format": "png"})["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        try:
            self._closing.close()
        finally:
            # Chromium's helper processes (renderer, crash handler) outlive the browser process
            # for a moment and write into the profile: stop the whole group, then wait until no
            # process of it is left before removing the profile.
            group = self._process.pid
            self._signal(group, signal.SIGTERM)
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._signal(group, signal.SIGKILL)
                self._process.wait()
            deadline = time.monotonic() + 10
            while self._signal(group, 0) and time.monotonic() < deadline:
                time.sleep(0.05)
            self._signal(group, signal.SIGKILL)
            self._home.cleanup()

    @staticmethod
    def _signal(group: int, number: int) -> bool:
        """Send ``number`` to the process group; whether any process of it was left."""
        try:
            os.killpg(group, number)
        except ProcessLookupError:
            return False
        return True
