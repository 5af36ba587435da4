"""The PostgreSQL ledger functions as ``.sql`` files: the one source the migrations install.

``NAME.sql`` holds one ``CREATE OR REPLACE FUNCTION quota_ledger_NAME`` statement, headed by a
comment on what the function does and what it locks. It is the function's current definition:
a database at the head revision has exactly that function (``tests/migrations`` checks it). A
migration installs a function with ``op.execute(sql.definition("NAME"))``.

A released revision builds the same schema for good, whichever way a database reaches it:
upgraded to it, downgraded to it, or migrated before a later release. So a function that a later
revision replaced keeps its older definition as ``NAME_vN.sql``, read by the migrations of its
time and never edited. Revision 0004 installs the functions and 0005 replaces the expiry
function: 0004 installs ``expire_v1.sql``, 0005 installs ``expire.sql`` and its downgrade
installs ``expire_v1.sql`` again. (0004 could have installed today's expiry function, which runs
on 0004's tables; but then what 0004 builds would depend on the package version.)

To change a function: copy ``NAME.sql`` to the next ``NAME_vN.sql``, point the migrations that
read ``NAME.sql`` at the copy, then edit ``NAME.sql`` and install it in a new revision whose
downgrade installs the copy.
"""

from __future__ import annotations

import re
from importlib import resources

#: a superseded definition, kept for the migrations that installed it
_VERSIONED = re.compile(r"_v\d+$")


def definition(name: str) -> str:
    """The statement in ``NAME.sql`` that (re)creates a function, with its header comment."""
    return resources.files(__name__).joinpath(f"{name}.sql").read_text(encoding="utf-8")


def names() -> list[str]:
    """The functions' current definitions (the files other than ``NAME_vN.sql``), sorted."""
    files = (entry.name for entry in resources.files(__name__).iterdir())
    stems = (name.removesuffix(".sql") for name in files if name.endswith(".sql"))
    return sorted(stem for stem in stems if not _VERSIONED.search(stem))
