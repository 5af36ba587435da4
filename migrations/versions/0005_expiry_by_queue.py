"""Expiry batches grouped by queue, and the reservation index that finds them.

The expiry function took the oldest expired reservations, one per queue when they were spread
out, and so updated four counters per row. It now takes the queues of the oldest ones and as
many of each queue's expired reservations as fit in the batch: each counter is updated once per
batch, not once per row. ``ix_reservations_partition_queue`` becomes
``(partition, queue, state, expires_at)`` so that a queue's expired reservations are found
without reading its history; every query that used the old index uses its prefix. The function
also updates its locked reservation rows by address and commits without waiting for the WAL
flush. On PostgreSQL and SQLite the pending-expiry index and the key index become partial
(``state = 'pending'``, ``key IS NOT NULL``); MariaDB has no partial indexes and keeps both.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from quota_ledger.driver import sql

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_PENDING = "ix_reservations_partition_state_expires_at"
_KEY = "uq_reservations_partition_key"


def _partial(predicate: str) -> dict[str, sa.TextClause]:
    return {"postgresql_where": sa.text(predicate), "sqlite_where": sa.text(predicate)}


def upgrade() -> None:
    engine = op.get_bind().dialect.name
    op.create_index(
        "ix_reservations_partition_queue_state_expires_at",
        "reservations",
        ["partition", "queue", "state", "expires_at"],
    )
    op.drop_index("ix_reservations_partition_queue", table_name="reservations")
    if engine in ("postgresql", "sqlite"):
        # Partial indexes: a row that leaves 'pending', or has no key, adds no entry to them.
        op.drop_index(_PENDING, table_name="reservations")
        op.create_index(
            _PENDING, "reservations", ["partition", "state", "expires_at"], **_partial("state = 'pending'")
        )
        with op.batch_alter_table("reservations") as batch:
            batch.drop_constraint(_KEY, type_="unique")
        op.create_index(
            _KEY, "reservations", ["partition", "key"], unique=True, **_partial("key IS NOT NULL")
        )
    if engine == "postgresql":
        op.execute(sql.definition("expire"))


def downgrade() -> None:
    engine = op.get_bind().dialect.name
    if engine == "postgresql":
        op.execute(sql.frozen("expire_v1"))  # the function of revision 0004
    if engine in ("postgresql", "sqlite"):
        op.drop_index(_KEY, table_name="reservations")
        with op.batch_alter_table("reservations") as batch:
            batch.create_unique_constraint(_KEY, ["partition", "key"])
        op.drop_index(_PENDING, table_name="reservations")
        op.create_index(_PENDING, "reservations", ["partition", "state", "expires_at"])
    op.create_index("ix_reservations_partition_queue", "reservations", ["partition", "queue"])
    op.drop_index("ix_reservations_partition_queue_state_expires_at", table_name="reservations")
