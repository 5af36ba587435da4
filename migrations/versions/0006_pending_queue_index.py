"""The per-queue reservation index holds only pending reservations.

``ix_reservations_partition_queue_state_expires_at`` finds a queue's expired reservations for
the expiry batch and is read for nothing else. As a full index, every commit, rollback and
expiry added an entry to it for the row's new state; partial (``state = 'pending'``, as the
pending-expiry index already is) a reservation leaves it when it is resolved, and a state
change writes to the primary key (and the key index, for keyed rows) only. Same name and
columns; MariaDB has no partial indexes and keeps the full one.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

_QUEUE = "ix_reservations_partition_queue_state_expires_at"
_COLUMNS = ["partition", "queue", "state", "expires_at"]


def upgrade() -> None:
    if op.get_bind().dialect.name in ("postgresql", "sqlite"):
        op.drop_index(_QUEUE, table_name="reservations")
        pending = sa.text("state = 'pending'")
        op.create_index(_QUEUE, "reservations", _COLUMNS, postgresql_where=pending, sqlite_where=pending)


def downgrade() -> None:
    if op.get_bind().dialect.name in ("postgresql", "sqlite"):
        op.drop_index(_QUEUE, table_name="reservations")
        op.create_index(_QUEUE, "reservations", _COLUMNS)
