"""Indexes for the usage history: the journal by time, resolved reservations by resolution time.

``GET /v1/usage/history`` rebuilds a queue's in-use and reserved usage over a window from the
ledger's own rows: the journal's changes and the reservations made and resolved in the window.
``ix_quota_journal_partition_created_at`` and ``ix_reservations_partition_resolved_at`` let it
read only the window's rows. The journal is append-only and written in time order, so its new
index grows at one end. The reservation index holds resolved rows only on PostgreSQL and SQLite
(a reservation enters it once, when it is committed, rolled back or expires); MariaDB has no
partial indexes and keeps a full one.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_JOURNAL = "ix_quota_journal_partition_created_at"
_RESOLVED = "ix_reservations_partition_resolved_at"


def upgrade() -> None:
    op.create_index(_JOURNAL, "quota_journal", ["partition", "created_at"])
    resolved = sa.text("resolved_at IS NOT NULL")
    op.create_index(
        _RESOLVED,
        "reservations",
        ["partition", "resolved_at"],
        postgresql_where=resolved,
        sqlite_where=resolved,
    )


def downgrade() -> None:
    op.drop_index(_RESOLVED, table_name="reservations")
    op.drop_index(_JOURNAL, table_name="quota_journal")
