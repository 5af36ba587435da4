"""PostgreSQL: the set functions decide a call of one request as fast as the single functions.

A call of ``quota_ledger_reserve_many`` or ``quota_ledger_commit_many`` for one request cost more
than ``quota_ledger_reserve`` and ``quota_ledger_commit``: every statement made a custom plan on
every call, and statements ran that could change nothing. A call of up to 8 requests now runs
each statement's generic plan (a larger call lets the plan cache choose, as before); the steps
of tracked requests, first uses and missing counters run only when there are any; each
application row is looked up by its whole key. ``quota_ledger_commit_many`` reads its
reservations and their items once and writes their states, items, journal rows and counters in
one statement; ``quota_ledger_reserve_many`` locks all of its counters in one statement and
writes its items and counters in another. Both decide and write what they did before, and lock
in the same order.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-27
"""

from __future__ import annotations

from alembic import op

from quota_ledger.driver import sql

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for name in ("reserve_many_v2", "commit_many_v2"):  # 0018 replaced them
        op.execute(sql.frozen(name))


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for name in ("reserve_many_v1", "commit_many_v1"):  # the functions of revision 0012
        op.execute(sql.frozen(name))
