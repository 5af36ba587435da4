"""PostgreSQL: an application row is always found by its whole key, whatever the statistics.

The indexes on ``quota_applications`` by user and by group both start with ``partition``. While
the table has no statistics (a new database, or one whose statistics predate its rows), the
planner costs a lookup by ``(partition, app_key)`` the same through any of the three indexes,
and a generic plan (planned once per connection, then kept) could take the group index and
filter every application row of the partition, on every reserve and commit of an application.
Both indexes are now partial (``user_name IS NOT NULL``, ``group_name IS NOT NULL``): a lookup by
user or group still uses them (an equality proves the predicate), a lookup by key cannot, and
the unique key index is the only one left for it. Same names and columns; MariaDB and SQLite
keep the full ones. ``quota_ledger_reserve_many`` passes its lists of users and groups as arrays,
so that locking a user's or group's applications is an index condition too, and deletes new
application rows only when a request it inserted was not admitted.

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from quota_ledger.driver import sql

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

_TABLE = "quota_applications"
_INDEXES = (
    ("ix_quota_applications_partition_user_name", "user_name"),
    ("ix_quota_applications_partition_group_name", "group_name"),
)


def _replace_indexes(*, partial: bool) -> None:
    for name, column in _INDEXES:
        op.drop_index(name, table_name=_TABLE)
        where = {"postgresql_where": sa.text(f"{column} IS NOT NULL")} if partial else {}
        op.create_index(name, _TABLE, ["partition", column], **where)


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    _replace_indexes(partial=True)
    for name in ("reserve_many", "commit_many"):
        op.execute(sql.definition(name))


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    _replace_indexes(partial=False)
    for name in ("reserve_many_v2", "commit_many_v2"):
        op.execute(sql.frozen(name))
