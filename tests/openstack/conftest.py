"""A real Keystone for the tests marked ``keystone``: one per test process, its venv built once.

The venv is cached (see keystone_server.py); when it cannot be built here (no network, no
Python headers for a dependency) every Keystone test is skipped with the reason, which the
summary prints. Otherwise they run wherever the suite runs, and the summary says how many ran
and how long the venv took to build.
"""

from __future__ import annotations

import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from keystone_server import KEYSTONE_VERSION, KeystoneServer, KeystoneUnavailable, keystone_venv

_ran: Counter[str] = Counter()
_notes: dict[str, str] = {}


@pytest.fixture(scope="session")
def keystone() -> Iterator[KeystoneServer]:
    """Keystone serving the flat model on a fresh SQLite database."""
    try:
        venv, seconds = keystone_venv()
    except KeystoneUnavailable as exc:
        _notes["skipped"] = str(exc)
        pytest.skip(str(exc))
    _notes["venv"] = f"venv built in {seconds:.0f} s" if seconds else "venv cached"
    with tempfile.TemporaryDirectory(prefix="keystone-") as home:
        server = KeystoneServer(venv=venv, home=Path(home))
        server.setup()
        server.start("flat")
        try:
            yield server
        finally:
            server.stop()


@pytest.fixture
def keystone_flat(keystone: KeystoneServer) -> KeystoneServer:
    keystone.start("flat")
    _ran["flat"] += 1
    return keystone


@pytest.fixture
def keystone_strict(keystone: KeystoneServer) -> KeystoneServer:
    keystone.start("strict_two_level")
    _ran["strict_two_level"] += 1
    return keystone


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Hand what ran to the summary of tests/conftest.py: through a pytest-xdist worker's output
    (the controller never loads this file), or on the config of a run without workers."""
    data = {"version": KEYSTONE_VERSION, "ran": dict(_ran), "notes": dict(_notes)}
    output = getattr(session.config, "workeroutput", None)
    if output is not None:
        output["keystone"] = data
    else:
        session.config.quota_ledger_keystone = data  # type: ignore[attr-defined]
