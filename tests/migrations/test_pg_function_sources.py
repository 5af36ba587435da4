"""The PostgreSQL functions in the database are the ones in ``quota_ledger/driver/sql``.

At the head revision every ``NAME.sql`` is installed as written (its body, and its whole definition
as PostgreSQL reports it) and no other ``quota_ledger_*`` function exists; a revision that a later
one replaced keeps its own definition, however the database reaches it.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Iterator
from importlib import resources

import pytest
from sqlalchemy import Connection, create_engine, text
from sqlalchemy.engine import URL

from quota_ledger import QuotaEngine
from quota_ledger.driver import migrate, sql
from quota_ledger.driver.dialect import normalize_url

_CREATED = re.compile(r"^CREATE OR REPLACE FUNCTION (quota_ledger_\w+)\(", re.MULTILINE)
_BODY = re.compile(r"\$\$(.*)\$\$", re.DOTALL)
_SCRATCH = "ql_function_sources"
# the current definitions and the superseded ones the migrations of their time read
_EVERY_FILE = sorted(
    entry.name.removesuffix(".sql") for entry in resources.files(sql).iterdir() if entry.name.endswith(".sql")
)


def function_of(name: str) -> str:
    """The function a file defines: ``expire.sql`` and ``expire_v1.sql`` both quota_ledger_expire."""
    return "quota_ledger_" + re.sub(r"_v\d+$", "", name)


def body(definition: str) -> str:
    """The function body of a definition (between ``$$`` and ``$$``), whitespace collapsed."""
    found = _BODY.search(definition)
    assert found is not None, definition
    return " ".join(found.group(1).split())


def definition_in(conn: Connection, schema: str, function: str) -> str:
    """``pg_get_functiondef`` of the one function of that name in that schema, schema name removed."""
    found = conn.execute(
        text(
            "SELECT pg_get_functiondef(p.oid) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
            " WHERE n.nspname = :schema AND p.proname = :name"
        ),
        {"schema": schema, "name": function},
    ).scalars()
    (only,) = list(found)
    return str(only).replace(f"{schema}.{function}(", f"{function}(")


def installed_body(conn: Connection, function: str) -> str:
    (source,) = conn.execute(
        text("SELECT prosrc FROM pg_proc WHERE proname = :name"), {"name": function}
    ).scalars()
    return " ".join(str(source).split())


@pytest.fixture
def head(postgres_url: URL) -> Iterator[Connection]:
    """A connection to a fresh database at the head revision (the test template's copy)."""
    engine = create_engine(normalize_url(postgres_url))
    with engine.connect() as conn:
        assert migrate.current(engine) == migrate.head()
        yield conn
    engine.dispose()


@pytest.mark.parametrize("name", _EVERY_FILE)
def test_each_file_creates_its_function_and_says_what_it_locks(name: str) -> None:
    definition = sql.definition(name)
    header = definition.split("CREATE OR REPLACE FUNCTION", 1)[0]
    assert header.startswith(f"-- {function_of(name)}")
    assert "Locks" in header
    assert _CREATED.findall(definition) == [function_of(name)]
    # the migrations run it through SQLAlchemy's text(): nothing in it may read as a parameter
    assert text(definition).compile().params == {}


def test_every_current_file_is_installed_as_written(head: Connection) -> None:
    assert "expire_v1" not in sql.names()
    for name in sql.names():
        assert installed_body(head, function_of(name)) == body(sql.definition(name)), name


def test_every_installed_definition_is_the_files_whole_definition(head: Connection) -> None:
    # Run each file again in an empty schema and compare what PostgreSQL reports for both: the
    # signature, result, language and settings too, not only the body.
    transaction = head.begin()
    try:
        head.execute(text(f"CREATE SCHEMA {_SCRATCH}"))
        head.execute(text(f"SET LOCAL search_path = {_SCRATCH}, public"))
        for name in sql.names():
            head.execute(text(sql.definition(name)))
        for name in sql.names():
            function = function_of(name)
            assert definition_in(head, "public", function) == definition_in(head, _SCRATCH, function)
    finally:
        transaction.rollback()


def test_no_ledger_function_but_the_files(head: Connection) -> None:
    installed = head.execute(
        text(r"SELECT proname FROM pg_proc WHERE proname LIKE 'quota\_ledger\_%' ORDER BY 1")
    ).scalars()
    assert list(installed) == sorted(function_of(name) for name in sql.names())


_RESERVED = text(
    "SELECT reserved FROM quota_usages WHERE scope_type = 'queue' AND scope = :q AND resource = 'fpga'"
)


def reserved(conn: Connection, queue: str) -> int:
    return int(conn.execute(_RESERVED, {"q": queue}).scalar_one())


# a sweep by hand: the version in force, any advisory lock key (a shared lock meets no writer here)
_EXPIRE = text(
    "SELECT quota_ledger_expire('default', 10, '{}', (SELECT version FROM quota_config_head), 1, 1)"
)


@pytest.mark.parametrize("empty_db", ["postgresql"], indirect=True)
def test_each_revision_keeps_its_expiry_function_up_and_down(empty_db: URL) -> None:
    assert "expire_v1" in _EVERY_FILE
    assert body(sql.definition("expire_v1")) != body(sql.definition("expire"))
    engine = create_engine(normalize_url(empty_db))
    try:
        migrate.upgrade(engine, "0004")
        with engine.connect() as conn:
            assert installed_body(conn, "quota_ledger_expire") == body(sql.definition("expire_v1"))
        migrate.upgrade(engine, "head")
        with engine.connect() as conn:
            assert installed_body(conn, "quota_ledger_expire") == body(sql.definition("expire"))
        with QuotaEngine.from_url(empty_db) as ledger:
            ledger.set_limits("root", {"fpga": 10})
            for queue in ("root.a", "root.b"):
                ledger.reserve(queue, {"fpga": 1}, ttl=0.01)
        time.sleep(0.05)
        # back at 0004 (its rows kept) the function of 0004 is back, and sweeps at its schema
        migrate.downgrade(engine, "0004")
        with engine.connect() as conn:
            assert installed_body(conn, "quota_ledger_expire") == body(sql.definition("expire_v1"))
            assert conn.execute(_EXPIRE).scalar_one() == 2
            conn.commit()
            assert reserved(conn, "root.a") == reserved(conn, "root.b") == 0
    finally:
        engine.dispose()


@pytest.mark.parametrize("empty_db", ["postgresql"], indirect=True)
def test_each_revision_keeps_its_reserve_function_up_and_down(empty_db: URL) -> None:
    assert len({body(sql.definition(name)) for name in ("reserve_v1", "reserve_v2", "reserve")}) == 3
    engine = create_engine(normalize_url(empty_db))
    try:
        migrate.upgrade(engine, "0008")
        with engine.connect() as conn:
            assert installed_body(conn, "quota_ledger_reserve") == body(sql.definition("reserve_v1"))
        migrate.upgrade(engine, "0012")
        with engine.connect() as conn:
            assert installed_body(conn, "quota_ledger_reserve") == body(sql.definition("reserve_v2"))
        migrate.upgrade(engine, "head")
        with engine.connect() as conn:
            assert installed_body(conn, "quota_ledger_reserve") == body(sql.definition("reserve"))
        with QuotaEngine.from_url(empty_db) as ledger:
            ledger.set_limits("root", {"fpga": 10})
            ledger.reserve("root.new", {"fpga": 1}, user="ann", application="a1")  # in the function
            assert ledger.driver.functions
        migrate.downgrade(engine, "0012")
        with engine.connect() as conn:
            assert installed_body(conn, "quota_ledger_reserve") == body(sql.definition("reserve_v2"))
        migrate.downgrade(engine, "0008")
        with engine.connect() as conn:
            assert installed_body(conn, "quota_ledger_reserve") == body(sql.definition("reserve_v1"))
        # this engine's call has the head's arguments: at 0008 it reserves on the general path
        with QuotaEngine.from_url(empty_db) as ledger:
            ledger.reserve("root.new", {"fpga": 1}, user="ann", application="a1")
            assert not ledger.driver.functions
            assert ledger.usage("root.new")["fpga"].reserved == 2
            assert ledger.audit() == []
    finally:
        engine.dispose()


@pytest.mark.parametrize("empty_db", ["postgresql"], indirect=True)
def test_each_revision_keeps_its_set_functions_up_and_down(empty_db: URL) -> None:
    names = {"quota_ledger_reserve_many": "reserve_many", "quota_ledger_commit_many": "commit_many"}
    for name in names.values():
        assert body(sql.definition(f"{name}_v1")) != body(sql.definition(name))
    engine = create_engine(normalize_url(empty_db))
    try:
        for revision, suffix in (("0012", "_v1"), ("head", ""), ("0014", "_v1"), ("head", "")):
            if revision == "0014":
                migrate.downgrade(engine, revision)
            else:
                migrate.upgrade(engine, revision)
            with engine.connect() as conn:
                for function, name in names.items():
                    assert installed_body(conn, function) == body(sql.definition(name + suffix)), revision
        # group commit decides on the head's functions
        with QuotaEngine.from_url(empty_db, batching=True) as ledger:
            ledger.set_limits("root", {"fpga": 10})
            ledger.commit(ledger.reserve("root.a", {"fpga": 1}).id)
            assert ledger.usage("root.a")["fpga"].in_use == 1
            assert ledger.audit() == []
    finally:
        engine.dispose()


# What each file held when the revision that installs it was released. A released revision must
# build the same function forever, so an edit to one of these files would silently change what
# existing databases would have got: add a revision instead (see quota_ledger/driver/sql).
_RELEASED = {
    "check_updated.sql": "1b2915cf8cffac5a",
    "commit.sql": "74140e964323e54a",
    "commit_many.sql": "41f4e63aa51a62ef",
    "commit_many_v1.sql": "82852b8da6d9eb78",
    "enter.sql": "d2ec4eb32fe35a0f",
    "expire.sql": "742feb5578cfb733",
    "expire_v1.sql": "ceecbe63f8f1d930",
    "lineage.sql": "f094c4eda18f5b12",
    "reserve.sql": "c9a49cb0832ef62a",
    "reserve_v2.sql": "95b0f62d5927aa9e",
    "reserve_many.sql": "d8b2700bdeceb09d",
    "reserve_many_v1.sql": "174a3296b7e4f486",
    "reserve_v1.sql": "36cb63393885e0c5",
    "try_commit.sql": "bd69858c05afaa00",
    "try_reserve.sql": "47db5b4af1a49d3f",
}


def test_released_function_files_are_never_edited() -> None:
    folder = resources.files(sql)
    found = {
        entry.name: hashlib.sha256(entry.read_bytes()).hexdigest()[:16]
        for entry in folder.iterdir()
        if entry.name.endswith(".sql")
    }
    edited = sorted(name for name, digest in _RELEASED.items() if found.get(name) != digest)
    assert not edited, (
        f"{edited} changed (or vanished) after a revision installed them: copy the old text to "
        "NAME_vN.sql for the old revisions, install the new text in a new revision, and pin it here"
    )
    unpinned = sorted(found.keys() - _RELEASED.keys())
    assert not unpinned, f"{unpinned} are installed by no released revision yet: pin them here"
