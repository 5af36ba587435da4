"""PostgreSQL: the reserve function creates what a first use needs instead of declining.

A reservation that is the first use of a queue, of an application, or of a user under a
wildcard user limit made ``quota_ledger_reserve`` decline, and the engine then ran the general
path: a failed call and a slower transaction on every first use. The function now creates the
queue's counters, a new application's row (charging the maxapplications counters on its way to
root and its user's and group's) and a user's copies of a wildcard limit in its own
transaction, as the general path does, before it locks any counter. It takes one more argument:
the limit each user/group counter is created with.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-24
"""

from __future__ import annotations

from alembic import op

from quota_ledger.driver import sql

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

_ARGUMENTS = (
    "text, text, text, text, text, text[], bigint[], bigint, text, text, integer, integer, integer,"
    " text[], text[], bigint[], text, text, text, text, text, text[], text[], text[], text[], bigint[]"
)
_BEFORE = f"quota_ledger_reserve({_ARGUMENTS})"
_AFTER = f"quota_ledger_reserve({_ARGUMENTS}, bigint[])"


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(f"DROP FUNCTION IF EXISTS {_BEFORE}")
    op.execute(sql.frozen("reserve_v2"))  # the function of revision 0010


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(f"DROP FUNCTION IF EXISTS {_AFTER}")
    op.execute(sql.frozen("reserve_v1"))  # the function of revision 0004
