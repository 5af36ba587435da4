"""PostgreSQL: functions that decide a batch's reservations and commits as a set.

Group commit sent one function call per request, each a dozen statements run one after another
on the server. ``quota_ledger_reserve_many`` reserves many requests of a partition (plain or
tracked) with one statement per step (their rows, their items, their application rows, one update
per counter with the sum), admitting the
longest prefix that fits; ``quota_ledger_commit_many`` commits many reservations the same way
(tracked ones too: each application row once for all of its reservations). What either
declines, the engine decides alone. MariaDB and SQLite get nothing here.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-24
"""

from __future__ import annotations

from alembic import op

from quota_ledger.driver import sql

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

# the definitions of this revision, which 0015 replaced
_DEFINITIONS = ("reserve_many_v1", "commit_many_v1")
_FUNCTIONS = (
    "quota_ledger_reserve_many(text, integer, integer, integer, text[], text[], text[], text[], text[],"
    " bigint[], text[], text[], text[], text[], text[], text[], integer[], text[], bigint[], integer[], text[],"
    " text[], text[], text[], bigint[], bigint[], integer[], text[], text[], bigint[])",
    "quota_ledger_commit_many(text[], text[], boolean)",
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
