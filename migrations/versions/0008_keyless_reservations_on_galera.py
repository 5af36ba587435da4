"""MariaDB: reservation keys are unique through a generated column, not the nullable key itself.

Galera certifies a write against the values of every unique index the row has, and a NULL is
one value there: two reservations without a key, written at the same time on two nodes of a
multi-writer cluster, conflicted on ``uq_reservations_partition_key (partition, NULL)`` and one
of them was rolled back and retried. MariaDB now keeps the key unique per partition through
``key_or_id``, a stored generated column that holds the key, or a tab and the reservation's id
when there is none, so no unique index holds a NULL; lookups by key use a plain index on
``(partition, key)``. PostgreSQL and SQLite keep their partial unique index
(``WHERE key IS NOT NULL``), which holds no entry for keyless rows.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

_KEY = "uq_reservations_partition_key"
_KEY_OR_ID = "uq_reservations_partition_key_or_id"
_BY_KEY = "ix_reservations_partition_key"
_EXPRESSION = "COALESCE(`key`, CONCAT(CHAR(9 USING utf8mb4), `id`))"


def _mariadb() -> bool:
    return op.get_bind().dialect.name in ("mariadb", "mysql")


def upgrade() -> None:
    if not _mariadb():
        return
    op.add_column(
        "reservations",
        sa.Column(
            "key_or_id",
            # MariaDB's form of quota_ledger.driver.schema.name_type, frozen
            mysql.VARCHAR(255 + 1 + 36, charset="utf8mb4", collation="utf8mb4_bin"),
            sa.Computed(sa.text(_EXPRESSION), persisted=True),
            comment="MariaDB: key, or TAB + id without one; unique per partition",
        ),
    )
    op.create_index(_KEY_OR_ID, "reservations", ["partition", "key_or_id"], unique=True)
    op.create_index(_BY_KEY, "reservations", ["partition", "key"])
    op.drop_index(_KEY, table_name="reservations")


def downgrade() -> None:
    if not _mariadb():
        return
    op.create_index(_KEY, "reservations", ["partition", "key"], unique=True)
    op.drop_index(_BY_KEY, table_name="reservations")
    op.drop_index(_KEY_OR_ID, table_name="reservations")
    op.drop_column("reservations", "key_or_id")
