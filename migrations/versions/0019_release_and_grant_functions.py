"""PostgreSQL: a rollback, a release and a waiting request's grant, each in one call.

``quota_ledger_release`` gives back what a plain reservation holds (no user, no application,
nothing a ResourceQuota counter of its queue counts): a pending one is rolled back, a committed
one released, on its queue's own counters and the subtree counters of its lineage, with its
journal rows, as the general path writes them. ``quota_ledger_grant`` grants one waiting request
by ``quota_ledger_reserve_many`` (the rule's set function), with a stand-in reservation whose
charges it moves to the waiting row. ``quota_ledger_over`` says whether a request would go over
a limit it is charged to. What the first two decline, the general path decides. MariaDB and
SQLite have no functions; nothing changes there.

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-28
"""

from __future__ import annotations

from alembic import op

from quota_ledger.driver import sql

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for name in ("release", "over", "grant"):
        op.execute(sql.definition(name))


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("DROP FUNCTION IF EXISTS quota_ledger_release(text, text, boolean)")
    op.execute("DROP FUNCTION IF EXISTS quota_ledger_grant")
    op.execute("DROP FUNCTION IF EXISTS quota_ledger_over")
