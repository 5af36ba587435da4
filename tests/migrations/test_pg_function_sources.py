"""The PostgreSQL functions in the database are the ones in ``quota_ledger/driver/sql``.

At the head revision every ``NAME.sql`` is installed as written (its body, and its whole definition
as PostgreSQL reports it) and no other ``quota_ledger_*`` function exists; a revision that a later
one replaced or dropped keeps its own definition, frozen as ``migrations/sql/NAME_vN.sql``, however
the database reaches it.
"""

from __future__ import annotations

import hashlib
import re
import time
import uuid
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import pytest
from sqlalchemy import Connection, create_engine, text
from sqlalchemy.engine import URL

from quota_ledger import QuotaEngine
from quota_ledger.driver import migrate, sql
from quota_ledger.driver.dialect import normalize_url

_CREATED = re.compile(r"^CREATE OR REPLACE FUNCTION (quota_ledger_\w+)\(", re.MULTILINE)
_BODY = re.compile(r"\$\$(.*)\$\$", re.DOTALL)
_VERSIONED = re.compile(r"_v\d+$")
_SCRATCH = "ql_function_sources"
MIGRATIONS = migrate.script_location()
# the current definitions (the package's) and the frozen ones the migrations of their time read
_CURRENT = sorted(
    entry.name.removesuffix(".sql") for entry in resources.files(sql).iterdir() if entry.name.endswith(".sql")
)
_FROZEN = sorted(path.stem for path in (MIGRATIONS / "sql").glob("*.sql"))
_EVERY_FILE = sorted(_CURRENT + _FROZEN)
# the single-request functions 0016 dropped: the set functions decide one request too
_RETIRED = {
    "quota_ledger_reserve": "reserve_v3",
    "quota_ledger_commit": "commit_v1",
    "quota_ledger_try_reserve": "try_reserve_v1",
    "quota_ledger_try_commit": "try_commit_v1",
}


def source(name: str) -> str:
    """A definition's text: the package's ``NAME.sql``, or a frozen ``NAME_vN.sql``."""
    return sql.frozen(name) if _VERSIONED.search(name) else sql.definition(name)


def function_of(name: str) -> str:
    """The function a file defines: ``expire.sql`` and ``expire_v1.sql`` both quota_ledger_expire."""
    return "quota_ledger_" + _VERSIONED.sub("", name)


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


def ledger_functions(conn: Connection) -> list[str]:
    installed = conn.execute(
        text(r"SELECT proname FROM pg_proc WHERE proname LIKE 'quota\_ledger\_%' ORDER BY 1")
    ).scalars()
    return list(installed)


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
    definition = source(name)
    header = definition.split("CREATE OR REPLACE FUNCTION", 1)[0]
    assert header.startswith(f"-- {function_of(name)}")
    assert "Locks" in header
    assert _CREATED.findall(definition) == [function_of(name)]
    # the migrations run it through SQLAlchemy's text(): nothing in it may read as a parameter
    assert text(definition).compile().params == {}


def test_the_package_holds_the_current_definitions_and_the_migrations_the_frozen_ones() -> None:
    assert sql.names() == _CURRENT
    assert not [name for name in _CURRENT if _VERSIONED.search(name)]
    assert _FROZEN
    assert all(_VERSIONED.search(name) for name in _FROZEN), _FROZEN
    assert sql.frozen_folder() == MIGRATIONS / "sql"
    assert sql.frozen("expire_v1") == (MIGRATIONS / "sql" / "expire_v1.sql").read_text(encoding="utf-8")
    with pytest.raises(ValueError, match="NAME_vN"):
        sql.frozen("expire")
    # a function retired has no current file: only its frozen copies
    assert not {function_of(name) for name in _CURRENT} & _RETIRED.keys()
    assert set(_RETIRED.values()) <= set(_FROZEN)


def test_every_frozen_file_is_read_by_a_migration() -> None:
    scripts = "\n".join(path.read_text(encoding="utf-8") for path in (MIGRATIONS / "versions").glob("*.py"))
    unread = [name for name in _FROZEN if f'"{name}"' not in scripts]
    assert not unread, f"{unread} are installed by no revision: delete them or read them with sql.frozen"


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
    installed = ledger_functions(head)
    assert installed == sorted(function_of(name) for name in sql.names())
    assert not set(installed) & _RETIRED.keys()


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
    assert "expire_v1" in _FROZEN
    assert body(sql.frozen("expire_v1")) != body(sql.definition("expire"))
    engine = create_engine(normalize_url(empty_db))
    try:
        migrate.upgrade(engine, "0004")
        with engine.connect() as conn:
            assert installed_body(conn, "quota_ledger_expire") == body(sql.frozen("expire_v1"))
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
            assert installed_body(conn, "quota_ledger_expire") == body(sql.frozen("expire_v1"))
            assert conn.execute(_EXPIRE).scalar_one() == 2
            conn.commit()
            assert reserved(conn, "root.a") == reserved(conn, "root.b") == 0
    finally:
        engine.dispose()


@pytest.mark.parametrize("empty_db", ["postgresql"], indirect=True)
def test_each_revision_keeps_its_reserve_function_up_and_down(empty_db: URL) -> None:
    versions = ("reserve_v1", "reserve_v2", "reserve_v3")
    assert len({body(sql.frozen(name)) for name in versions}) == 3
    engine = create_engine(normalize_url(empty_db))

    def installed() -> str | None:
        with engine.connect() as conn:
            if "quota_ledger_reserve" not in ledger_functions(conn):
                return None
            return installed_body(conn, "quota_ledger_reserve")

    try:
        # the function of 0004, then of 0010, then of 0013, then none since 0016
        for revision, name in (("0008", "reserve_v1"), ("0012", "reserve_v2"), ("0015", "reserve_v3")):
            migrate.upgrade(engine, revision)
            assert installed() == body(sql.frozen(name)), revision
        migrate.upgrade(engine, "head")
        assert installed() is None
        with QuotaEngine.from_url(empty_db) as ledger:  # (an engine needs the schema at head)
            ledger.set_limits("root", {"fpga": 10})
            ledger.reserve("root.new", {"fpga": 1}, user="ann", application="a1")
        migrate.downgrade(engine, "0015")
        assert installed() == body(sql.frozen("reserve_v3"))
        for revision, name in (("0012", "reserve_v2"), ("0008", "reserve_v1")):
            migrate.downgrade(engine, revision)
            assert installed() == body(sql.frozen(name)), revision
        # up again: what was reserved is still there, and the counters agree with it
        migrate.upgrade(engine, "head")
        assert installed() is None
        with QuotaEngine.from_url(empty_db) as ledger:
            assert ledger.usage("root.new")["fpga"].reserved == 1
            assert ledger.audit() == []
    finally:
        engine.dispose()


@pytest.mark.parametrize("empty_db", ["postgresql"], indirect=True)
def test_each_revision_keeps_its_set_functions_up_and_down(empty_db: URL) -> None:
    names = {"quota_ledger_reserve_many": "reserve_many", "quota_ledger_commit_many": "commit_many"}
    for name in names.values():
        for version in ("v1", "v2"):
            assert body(sql.frozen(f"{name}_{version}")) != body(sql.definition(name))
    engine = create_engine(normalize_url(empty_db))
    # each revision's functions: 0012's (v1), 0015's (v2), 0018's (the package's)
    steps = (("0012", "v1"), ("0017", "v2"), ("head", None), ("0017", "v2"), ("0014", "v1"), ("head", None))
    try:
        for revision, frozen in steps:
            current = migrate.current(engine)
            if revision != "head" and current is not None and current > revision:
                migrate.downgrade(engine, revision)
            else:
                migrate.upgrade(engine, revision)
            with engine.connect() as conn:
                for function, name in names.items():
                    expected = sql.frozen(f"{name}_{frozen}") if frozen else sql.definition(name)
                    assert installed_body(conn, function) == body(expected), revision
        # group commit decides on the head's functions
        with QuotaEngine.from_url(empty_db, batching=True) as ledger:
            ledger.set_limits("root", {"fpga": 10})
            ledger.commit(ledger.reserve("root.a", {"fpga": 1}).id)
            assert ledger.usage("root.a")["fpga"].in_use == 1
            assert ledger.audit() == []
    finally:
        engine.dispose()


def definitions(conn: Connection, functions: list[str]) -> dict[str, str]:
    return {function: definition_in(conn, "public", function) for function in functions}


# a plain reserve of 1 fpga in root.a and its commit, through the guarded functions of 0011 and so
# through the reserve function of 0013 and the commit function of 0004 that they call
_TRY_RESERVE = (
    "SELECT quota_ledger_try_reserve('{id}', 'default', NULL, 'hash', 'root.a', ARRAY['fpga'],"
    " ARRAY[1]::bigint[], 60000000, NULL, NULL, (SELECT version FROM quota_config_head), 1, 1,"
    " '{{}}', '{{}}', '{{}}', NULL, NULL, NULL, NULL, NULL, '{{}}', '{{}}', '{{}}', '{{}}', '{{}}', '{{}}')"
)
_TRY_COMMIT = "SELECT count(*) FROM quota_ledger_try_commit('{id}', 'op-{id}')"


@pytest.mark.parametrize("empty_db", ["postgresql"], indirect=True)
def test_0016_drops_the_single_request_functions_and_its_downgrade_installs_them_again(
    empty_db: URL,
) -> None:
    retired = sorted(_RETIRED)
    engine = create_engine(normalize_url(empty_db))
    try:
        migrate.upgrade(engine, "0015")
        with engine.connect() as conn:
            at_0015 = ledger_functions(conn)
            released = definitions(conn, retired)
            kept = definitions(conn, [f for f in at_0015 if f not in _RETIRED])
            for function, name in _RETIRED.items():
                assert installed_body(conn, function) == body(sql.frozen(name)), function
        assert set(retired) <= set(at_0015)
        migrate.upgrade(engine, "0016")
        with engine.connect() as conn:
            assert ledger_functions(conn) == [f for f in at_0015 if f not in _RETIRED]
            assert definitions(conn, list(kept)) == kept
        migrate.upgrade(engine, "head")
        with QuotaEngine.from_url(empty_db) as ledger:
            ledger.set_limits("root", {"fpga": 10})
        migrate.downgrade(engine, "0015")
        with engine.connect() as conn:
            # the very functions 0013 and 0011 left: signature, result, settings and body
            assert ledger_functions(conn) == at_0015
            assert definitions(conn, retired) == released
            for function, name in _RETIRED.items():
                assert installed_body(conn, function) == body(sql.frozen(name)), function
        # and they work at 0015: a reserve and its commit, each in its own transaction (the
        # limit was set at head: an engine needs the schema at head)
        reservation = uuid.uuid4().hex
        with engine.begin() as conn:
            assert conn.execute(text(_TRY_RESERVE.format(id=reservation))).scalar_one() is not None
        with engine.begin() as conn:
            assert conn.execute(text(_TRY_COMMIT.format(id=reservation))).scalar_one() == 1
            # a second commit is declined, and the guarded function returns no row
            assert conn.execute(text(_TRY_COMMIT.format(id=reservation))).scalar_one() == 0
        migrate.upgrade(engine, "head")
        with QuotaEngine.from_url(empty_db) as ledger:
            assert ledger.usage("root.a")["fpga"].in_use == 1
            assert ledger.audit() == []
        with engine.connect() as conn:
            assert not set(ledger_functions(conn)) & _RETIRED.keys()
    finally:
        engine.dispose()


# What each file held when the revision that installs it was released, wherever it is now: the
# current definitions in quota_ledger/driver/sql, the frozen ones (NAME_vN) in migrations/sql. A
# released revision must build the same function forever, so an edit to one of these files would
# silently change what existing databases would have got: add a revision instead (see
# quota_ledger/driver/sql).
_RELEASED = {
    # current
    "check_updated.sql": "1b2915cf8cffac5a",
    "commit_many.sql": "bc854aa5ea8340ab",
    "enter.sql": "d2ec4eb32fe35a0f",
    "expire.sql": "742feb5578cfb733",
    "grant.sql": "26b495c9e800eb22",
    "lineage.sql": "f094c4eda18f5b12",
    "over.sql": "1940efa85fe34dcb",
    "release.sql": "7add6e25c0e0a2a7",
    "reserve_many.sql": "fbc3da949854b21e",
    # frozen
    "commit_many_v1.sql": "82852b8da6d9eb78",
    "commit_many_v2.sql": "43245f16234dabbf",  # commit_many.sql of 0015, replaced by 0018
    "commit_v1.sql": "74140e964323e54a",  # commit.sql of 0004, dropped by 0016
    "expire_v1.sql": "ceecbe63f8f1d930",
    "reserve_many_v1.sql": "174a3296b7e4f486",
    "reserve_many_v2.sql": "9fa8bbcf448e8b02",  # reserve_many.sql of 0015, replaced by 0018
    "reserve_v1.sql": "36cb63393885e0c5",
    "reserve_v2.sql": "95b0f62d5927aa9e",
    "reserve_v3.sql": "c9a49cb0832ef62a",  # reserve.sql of 0013, dropped by 0016
    "try_commit_v1.sql": "bd69858c05afaa00",  # try_commit.sql of 0011, dropped by 0016
    "try_reserve_v1.sql": "47db5b4af1a49d3f",  # try_reserve.sql of 0011, dropped by 0016
}


def _digests(folder: Path) -> dict[str, str]:
    return {
        path.name: hashlib.sha256(path.read_bytes()).hexdigest()[:16] for path in sorted(folder.glob("*.sql"))
    }


def test_released_function_files_are_never_edited() -> None:
    current = _digests(Path(str(resources.files(sql))))
    frozen = _digests(MIGRATIONS / "sql")
    assert not current.keys() & frozen.keys()
    found = {**current, **frozen}
    edited = sorted(name for name, digest in _RELEASED.items() if found.get(name) != digest)
    assert not edited, (
        f"{edited} changed (or vanished) after a revision installed them: copy the old text to "
        "migrations/sql/NAME_vN.sql for the old revisions, install the new text in a new revision, "
        "and pin it here"
    )
    unpinned = sorted(found.keys() - _RELEASED.keys())
    assert not unpinned, f"{unpinned} are installed by no released revision yet: pin them here"


_0019 = ("quota_ledger_grant", "quota_ledger_over", "quota_ledger_release")


@pytest.mark.parametrize("empty_db", ["postgresql"], indirect=True)
def test_0019_adds_the_release_and_grant_functions_and_an_engine_runs_without_them(empty_db: URL) -> None:
    """Revision 0019 adds three functions and its downgrade drops them; an engine on a database
    at 0018 (an upgrade not run yet) rolls back, releases and grants by the rule's paths."""
    engine = create_engine(normalize_url(empty_db))
    try:
        migrate.upgrade(engine, "0018")
        with engine.connect() as conn:
            at_0018 = ledger_functions(conn)
        assert not set(at_0018) & set(_0019)
        migrate.upgrade(engine, "head")
        with engine.connect() as conn:
            assert ledger_functions(conn) == sorted([*at_0018, *_0019])
        migrate.downgrade(engine, "0018")
        with engine.connect() as conn:
            assert ledger_functions(conn) == at_0018
        with QuotaEngine.from_url(empty_db, wait_poll_interval=30) as ledger:
            ledger.set_limits("root.a", {"fpga": 2})
            held = ledger.reserve("root.a", {"fpga": 2})
            queued = ledger.reserve("root.a", {"fpga": 2}, wait=60, block=False)
            ledger.rollback(held.id)
            granted = ledger.wait_for(queued.id, 10)
            assert granted.state.value == "pending"
            ledger.commit(granted.id)
            released = ledger.release_reservation(granted.id)
            assert released.released_at is not None
            assert ledger.usage("root.a")["fpga"].in_use == 0
            assert ledger.audit() == []
            assert ledger.driver.installed == {
                name: False for name in ("quota_ledger_release", "quota_ledger_grant")
            }
        migrate.upgrade(engine, "head")
    finally:
        engine.dispose()
