"""PostgreSQL: the reserve function looks up each missing counter by its whole key.

``quota_ledger_reserve`` asks which of a request's user/group counters, and which of its queue
counters, do not exist yet. A plan made for a short array could answer with an anti-join over
every counter of the partition instead of one lookup by key each, a cost that grew with the
partition's users on every tracked reservation. The function is otherwise unchanged.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-24
"""

from __future__ import annotations

from alembic import op

from quota_ledger.driver import sql

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(sql.frozen("reserve_v3"))  # the function of this revision, which 0016 dropped


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(sql.frozen("reserve_v2"))  # the function of revision 0010
