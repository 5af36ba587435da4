"""PostgreSQL: reserve and commit functions that decline without aborting the transaction.

Group commit (``QuotaEngine(..., batching=True)``) decides many requests in one transaction.
``quota_ledger_reserve`` and ``quota_ledger_commit`` decline what they do not cover by raising
SQLSTATE ``QL001``, which would abort that whole transaction; ``quota_ledger_try_reserve`` and
``quota_ledger_try_commit`` call them inside an exception block, so a decline undoes only that
call and returns NULL (no row), and the engine takes the general path for that request alone.
MariaDB and SQLite get nothing here.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-24
"""

from __future__ import annotations

from alembic import op

from quota_ledger.driver import sql

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

# the definitions of this revision, which 0016 dropped
_DEFINITIONS = ("try_reserve_v1", "try_commit_v1")
_FUNCTIONS = (
    "quota_ledger_try_commit(text, text)",
    "quota_ledger_try_reserve(text, text, text, text, text, text[], bigint[], bigint, text, text, integer,"
    " integer, integer, text[], text[], bigint[], text, text, text, text, text, text[], text[], text[],"
    " text[], bigint[], bigint[])",
)


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for name in _DEFINITIONS:
        op.execute(sql.frozen(name))


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for signature in _FUNCTIONS:
        op.execute(f"DROP FUNCTION IF EXISTS {signature}")
