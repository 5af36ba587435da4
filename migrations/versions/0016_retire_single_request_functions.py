"""PostgreSQL: the single-request functions are retired; the set functions decide every call.

``quota_ledger_reserve_many`` and ``quota_ledger_commit_many`` decide any number of requests,
one included, as fast as the single functions since 0015. ``quota_ledger_reserve``,
``quota_ledger_commit`` and their guarded forms ``quota_ledger_try_reserve`` and
``quota_ledger_try_commit`` (which call them) are dropped. The downgrade installs them again as
0013 and 0011 left them (``migrations/sql``). MariaDB and SQLite get nothing here.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-27
"""

from __future__ import annotations

from alembic import op

from quota_ledger.driver import sql

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

_RESERVE_ARGUMENTS = (
    "text, text, text, text, text, text[], bigint[], bigint, text, text, integer, integer, integer,"
    " text[], text[], bigint[], text, text, text, text, text, text[], text[], text[], text[], bigint[],"
    " bigint[]"
)
# the guarded functions first: they call the plain ones
_FUNCTIONS = (
    "quota_ledger_try_commit(text, text)",
    f"quota_ledger_try_reserve({_RESERVE_ARGUMENTS})",
    "quota_ledger_commit(text, text)",
    f"quota_ledger_reserve({_RESERVE_ARGUMENTS})",
)
# what the downgrade installs again, in dependency order: the reserve function of 0013, the
# commit function of 0004, the guarded functions of 0011
_FROZEN = ("reserve_v3", "commit_v1", "try_reserve_v1", "try_commit_v1")


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for signature in _FUNCTIONS:
        op.execute(f"DROP FUNCTION IF EXISTS {signature}")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for name in _FROZEN:
        op.execute(sql.frozen(name))
