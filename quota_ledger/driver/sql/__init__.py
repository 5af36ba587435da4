"""The PostgreSQL ledger functions as ``.sql`` files: the one source the migrations install.

``NAME.sql`` holds one ``CREATE OR REPLACE FUNCTION quota_ledger_NAME`` statement, headed by a
comment on what the function does and what it locks. It is the function's current definition:
a database at the head revision has exactly the functions of this folder, as written
(``tests/migrations`` checks it). A migration installs one with ``op.execute(sql.definition("NAME"))``.

A released revision builds the same schema for good, whichever way a database reaches it:
upgraded to it, downgraded to it, or migrated before a later release. So a definition that a
later revision replaced or dropped is frozen as ``NAME_vN.sql`` in the migration scripts' own
``sql`` folder (``migrations/sql`` in a checkout, ``quota_ledger/_migrations/sql`` in a wheel),
read with ``sql.frozen("NAME_vN")`` by the migrations of its time and never edited; this folder
keeps only what a database at the head revision runs. Revision 0004 installs the functions and
0005 replaces the expiry function: 0004 installs ``expire_v1``, 0005 installs ``expire.sql`` and
its downgrade installs ``expire_v1`` again. (0004 could have installed today's expiry function,
which runs on 0004's tables; but then what 0004 builds would depend on the package version.)

To change a function: copy ``NAME.sql`` to the next ``migrations/sql/NAME_vN.sql``, point the
migrations that read ``NAME.sql`` at the copy, then edit ``NAME.sql`` and install it in a new
revision whose downgrade installs the copy. To retire one: move ``NAME.sql`` to the next
``migrations/sql/NAME_vN.sql`` the same way, and drop the function in a new revision whose
downgrade installs the copy.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

from quota_ledger.driver import migrate

#: a frozen definition's name: NAME_vN
_VERSIONED = re.compile(r"_v\d+$")


def definition(name: str) -> str:
    """The statement in ``NAME.sql`` that (re)creates a function, with its header comment."""
    return resources.files(__name__).joinpath(f"{name}.sql").read_text(encoding="utf-8")


def names() -> list[str]:
    """The functions' current definitions (every ``NAME.sql`` of this folder), sorted."""
    files = (entry.name for entry in resources.files(__name__).iterdir())
    return sorted(name.removesuffix(".sql") for name in files if name.endswith(".sql"))


def frozen_folder() -> Path:
    """Where the frozen definitions are: the ``sql`` folder of the migration scripts."""
    return migrate.script_location() / "sql"


def frozen(name: str) -> str:
    """The statement in a frozen ``NAME_vN.sql``, as the revisions of its time installed it."""
    if not _VERSIONED.search(name):
        raise ValueError(f"{name!r} is not a frozen definition (NAME_vN)")
    return (frozen_folder() / f"{name}.sql").read_text(encoding="utf-8")
