"""Where the ledger lives: the default database, and how entry points open it.

The CLI and the service share one default, a SQLite file in the user's data directory
(``$XDG_DATA_HOME/quota-ledger/ledger.db``, else ``~/.local/share/quota-ledger/ledger.db``), so
that what ``quota-ledger serve`` records, ``quota-ledger usage`` reads. A command that only reads or
changes a ledger must not create one: SQLite would leave an empty file behind, and the next
command would then find a file without tables.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from quota_ledger.model import url_text
from quota_ledger.model.errors import LedgerMissing

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

# quota_ledger.driver.dialect (SQLAlchemy) is imported by the functions that parse a URL, not with
# this module: the command line names the default file in its --help, which must start quickly.

APP_DIR = "quota-ledger"
FILE_NAME = "ledger.db"


def data_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``$XDG_DATA_HOME/quota-ledger``; ``~/.local/share`` when it is unset, empty or relative,
    as the XDG Base Directory specification says."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_DATA_HOME", "")
    root = Path(base) if base and Path(base).is_absolute() else Path.home() / ".local" / "share"
    return root / APP_DIR


def default_file(environ: Mapping[str, str] | None = None) -> Path:
    """The default ledger file."""
    return data_dir(environ) / FILE_NAME


def default_db_url(environ: Mapping[str, str] | None = None) -> str:
    """The URL of the default ledger file (read at the entry points, with the settings)."""
    return f"sqlite:///{default_file(environ)}"


def split_urls(text: str) -> list[str]:
    """The URLs of a setting that may hold several, separated by whitespace before each URL's
    scheme (see :func:`quota_ledger.model.url_text.split`)."""
    return url_text.split(text)


def sqlite_file(url: str | URL) -> Path | None:
    """The file of a SQLite URL; None for other databases, in-memory SQLite and a list."""
    from quota_ledger.driver.dialect import parse_url

    if isinstance(url, str) and len(split_urls(url)) > 1:
        for one in split_urls(url):
            parse_url(one)  # a text that is no URL is refused, one URL or several
        return None
    parsed = parse_url(url)
    if parsed.get_backend_name() != "sqlite":
        return None
    database = parsed.database or ""
    if database in ("", ":memory:") or parsed.query.get("uri") == "true" or database.startswith("file:"):
        return None
    return Path(database).expanduser().absolute()


def describe(url: str | URL) -> str:
    """Where the data lives, for people: the file of SQLite, else the URL without its password."""
    from quota_ledger.driver.dialect import parse_url

    path = sqlite_file(url)
    if path is not None:
        return str(path)
    urls = split_urls(url) if isinstance(url, str) else [url]
    return " ".join(parse_url(one).render_as_string(hide_password=True) for one in urls)


def prepare(url: str | URL) -> None:
    """Make the directory and the file of a SQLite ledger that is about to be created, readable
    by their owner only: the ledger holds the service's token digests and everyone's usage, and
    SQLite gives its journal files the database file's permissions."""
    path = sqlite_file(url)
    if path is None:
        return
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):  # an existing ledger keeps its permissions
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))


def require_existing(url: str | URL) -> None:
    """Refuse (:class:`LedgerMissing`) to open a SQLite ledger whose file does not exist."""
    path = sqlite_file(url)
    if path is not None and not path.exists():
        raise LedgerMissing(path)
