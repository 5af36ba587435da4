"""A real Keystone of the tests' own: a venv built once, a SQLite database, a loopback port.

The venv (``pip install keystone==KEYSTONE_VERSION``) is cached under
``$XDG_CACHE_HOME/quota-ledger/keystone-venv-<version>`` (``~/.cache`` unless set) and built
under a file lock, so parallel test workers build it once. Beside it lies a template made once
as Keystone's install guide says (``keystone-manage db_sync``, ``fernet_setup``,
``credential_setup``, ``bootstrap``); each server starts from a copy of it and points the
catalog's identity endpoints at its own port. Keystone's WSGI application is served by werkzeug
(a Keystone dependency) from that venv: no uwsgi, no Apache. Its enforcement model is
``keystone.conf``'s ``[unified_limit] enforcement_model``, so switching models restarts the
server on the same database.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

KEYSTONE_VERSION = "30.0.0"
ADMIN_PASSWORD = "ledger-test-admin"  # a throwaway Keystone of the tests' own
REGION = "RegionOne"
#: seconds a failed build is believed before it is tried again
FAILURE_SECONDS = 600
#: changes when the template is made differently (the admin's password hash rounds, say)
TEMPLATE_FORMAT = "2"

_SERVE = """\
import os
import sys
from werkzeug.serving import make_server
from keystone.server import wsgi

sys.argv = sys.argv[:1]  # Keystone's configuration reads the command line
app = wsgi.initialize_public_application()
server = make_server("127.0.0.1", int(os.environ["KEYSTONE_PORT"]), app, threaded=True)
print("serving", flush=True)
server.serve_forever()
"""


class KeystoneUnavailable(Exception):
    """The Keystone venv could not be built here."""


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "quota-ledger"


def keystone_venv() -> tuple[Path, float]:
    """The venv's directory (with its template) and the seconds building them took (0 when
    cached)."""
    venv = cache_dir() / f"keystone-venv-{KEYSTONE_VERSION}"
    venv.parent.mkdir(parents=True, exist_ok=True)
    with (venv.parent / f"keystone-venv-{KEYSTONE_VERSION}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        started = time.monotonic()
        failed = venv.parent / f"keystone-venv-{KEYSTONE_VERSION}.failed"
        if failed.exists() and time.time() - failed.stat().st_mtime < FAILURE_SECONDS:
            raise KeystoneUnavailable(failed.read_text())  # tried a moment ago: not once per worker
        if not (venv / ".ready").exists():
            try:
                _build(venv)
            except KeystoneUnavailable as exc:
                failed.write_text(str(exc))
                raise
            failed.unlink(missing_ok=True)
        template = venv / "template"
        marker = template / ".ready"
        if not marker.exists() or marker.read_text() != TEMPLATE_FORMAT:
            shutil.rmtree(template, ignore_errors=True)
            template.mkdir()
            KeystoneServer(venv=venv, home=template, port=1).bootstrap()
            marker.write_text(TEMPLATE_FORMAT)
        took = time.monotonic() - started
        return venv, took if took > 1 else 0.0


def _build(venv: Path) -> None:
    shutil.rmtree(venv, ignore_errors=True)
    pip = [str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check"]
    for step in ([sys.executable, "-m", "venv", str(venv)], [*pip, f"keystone=={KEYSTONE_VERSION}"]):
        done = subprocess.run(step, capture_output=True, text=True, timeout=900, check=False)
        if done.returncode != 0:
            said = (done.stderr or done.stdout).strip().splitlines()
            tail = " ".join([line for line in said if not line.startswith("WARNING")][-3:])
            raise KeystoneUnavailable(f"cannot build the Keystone venv ({' '.join(step[:3])}): {tail}")
    (venv / ".ready").write_text(KEYSTONE_VERSION)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class KeystoneServer:
    """One Keystone on a loopback port; :meth:`start` again to switch its enforcement model."""

    venv: Path
    home: Path
    port: int = field(default_factory=_free_port)
    model: str = ""
    process: subprocess.Popen[str] | None = None
    _token: str | None = None
    #: whether the catalog's identity endpoints name this server's port
    _moved: bool = True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v3"

    def _conf(self, model: str) -> Path:
        conf = self.home / "keystone.conf"
        conf.write_text(
            f"""[DEFAULT]
log_file = {self.home / "keystone.log"}
[database]
connection = sqlite:///{self.home / "keystone.db"}
[token]
provider = fernet
[fernet_tokens]
key_repository = {self.home / "fernet-keys"}
[fernet_receipts]
key_repository = {self.home / "fernet-keys"}
[credential]
key_repository = {self.home / "credential-keys"}
[unified_limit]
enforcement_model = {model}
[cache]
enabled = true
backend = dogpile.cache.memory
[identity]
# the fewest bcrypt rounds: a password check costs a throwaway Keystone milliseconds, not 0.3 s
password_hash_rounds = 4
"""
        )
        return conf

    def _manage(self, *args: str) -> None:
        command = [
            str(self.venv / "bin" / "keystone-manage"),
            "--config-file",
            str(self.home / "keystone.conf"),
            *args,
        ]
        done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"keystone-manage {args[0]} failed: {done.stderr[-2000:]}")

    def setup(self) -> None:
        """A fresh database with keys and the admin: a copy of the venv's template."""
        template = self.venv / "template"
        shutil.copy(template / "keystone.db", self.home / "keystone.db")
        for keys in ("fernet-keys", "credential-keys"):
            shutil.copytree(template / keys, self.home / keys)
        self._moved = False

    def bootstrap(self) -> None:
        """A new database with keys and the admin, as Keystone's install guide makes them."""
        self._conf("flat")
        self._manage("db_sync")
        owner = ["--keystone-user", "root", "--keystone-group", "root"] if os.getuid() == 0 else []
        self._manage("fernet_setup", *owner)
        self._manage("credential_setup", *owner)
        self._manage(
            "bootstrap",
            "--bootstrap-password",
            ADMIN_PASSWORD,
            "--bootstrap-admin-url",
            self.url + "/",
            "--bootstrap-public-url",
            self.url + "/",
            "--bootstrap-internal-url",
            self.url + "/",
            "--bootstrap-region-id",
            REGION,
        )

    def start(self, model: str) -> None:
        """Serve with enforcement model ``model`` (restarting when another one is served)."""
        if self.process is not None and self.model == model:
            return
        self.stop()
        self._conf(model)
        script = self.home / "serve.py"
        script.write_text(_SERVE)
        env = {
            **os.environ,
            "OS_KEYSTONE_CONFIG_FILES": str(self.home / "keystone.conf"),
            "KEYSTONE_PORT": str(self.port),
            "PYTHONWARNINGS": "ignore",
        }
        self.process = subprocess.Popen(
            [str(self.venv / "bin" / "python"), str(script)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=(self.home / "serve.err").open("a"),
            text=True,
        )
        self.model = model
        self._token = None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"Keystone exited: {(self.home / 'serve.err').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(self.url + "/", timeout=2):
                    break
            except OSError:
                time.sleep(0.2)
        else:
            raise RuntimeError("Keystone did not answer within 60 s")
        if not self._moved:
            for endpoint in self.call("GET", "/endpoints")["endpoints"]:
                self.call("PATCH", f"/endpoints/{endpoint['id']}", {"endpoint": {"url": self.url + "/"}})
            self._moved = True

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process = None

    # -- the admin's REST calls ----------------------------------------------------------------
    def auth(self) -> dict[str, Any]:
        """keystoneauth1 password options of the bootstrap admin."""
        return {
            "auth_url": self.url,
            "username": "admin",
            "password": ADMIN_PASSWORD,
            "project_name": "admin",
            "user_domain_id": "default",
            "project_domain_id": "default",
        }

    def token(self) -> str:
        if self._token is None:
            body = {
                "auth": {
                    "identity": {
                        "methods": ["password"],
                        "password": {
                            "user": {"name": "admin", "domain": {"id": "default"}, "password": ADMIN_PASSWORD}
                        },
                    },
                    "scope": {"system": {"all": True}},
                }
            }
            request = urllib.request.Request(
                self.url + "/auth/tokens",
                data=json.dumps(body).encode(),
                headers={"Content-Type": "application/json"},
                method="POST",
            )
            with urllib.request.urlopen(request, timeout=30) as answer:
                self._token = answer.headers["X-Subject-Token"]
        assert self._token is not None
        return self._token

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        request = urllib.request.Request(
            self.url + path,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Content-Type": "application/json", "X-Auth-Token": self.token()},
            method=method,
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                text = answer.read()
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"{method} {path}: {exc.code} {exc.read()[:500]!r}") from exc
        return json.loads(text) if text else {}
