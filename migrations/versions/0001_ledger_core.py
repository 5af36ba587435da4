"""Ledger core: partitions, usage counters, reservations with items, and the journal.

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _name(length: int) -> sa.types.TypeEngine[str]:
    # Frozen copy of quota_ledger.driver.schema.name_type: binary collation on every engine.
    return (
        sa.String(length)
        .with_variant(sa.String(length, collation="C"), "postgresql")
        .with_variant(mysql.VARCHAR(length, charset="utf8mb4", collation="utf8mb4_bin"), "mysql", "mariadb")
    )


def _ts() -> sa.types.TypeEngine[datetime]:
    return sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")


_BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "quota_partitions",
        sa.Column("name", _name(64), nullable=False, comment="partition; the unit of admin locking"),
        sa.Column("created_at", _ts(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_quota_partitions")),
        comment="One row per partition. Reservations take it shared, limit changes exclusively.",
    )
    op.create_table(
        "quota_usages",
        sa.Column("id", _BIG_ID, autoincrement=True, nullable=False),
        sa.Column("partition", _name(64), nullable=False),
        sa.Column(
            "scope_type",
            sa.String(16),
            nullable=False,
            comment="queue: usage charged to exactly this queue; subtree: this queue and all below it",
        ),
        sa.Column("scope", _name(255), nullable=False, comment="queue path, e.g. root.a.b"),
        sa.Column("resource", _name(253), nullable=False),
        sa.Column("in_use", sa.BigInteger(), nullable=False, comment="committed usage, base units"),
        sa.Column("reserved", sa.BigInteger(), nullable=False, comment="pending reservations"),
        sa.Column(
            "hard_limit", sa.BigInteger(), nullable=True, comment="NULL = unlimited; subtree rows only"
        ),
        sa.Column("updated_at", _ts(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_quota_usages")),
        sa.UniqueConstraint(
            "partition",
            "scope_type",
            "scope",
            "resource",
            name=op.f("uq_quota_usages_partition_scope_type_scope_resource"),
        ),
        sa.CheckConstraint("in_use >= 0", name=op.f("ck_quota_usages_in_use_nonnegative")),
        sa.CheckConstraint("reserved >= 0", name=op.f("ck_quota_usages_reserved_nonnegative")),
        sa.CheckConstraint(
            "hard_limit IS NULL OR hard_limit >= 0", name=op.f("ck_quota_usages_hard_limit_nonnegative")
        ),
        sa.CheckConstraint(
            "scope_type IN ('queue', 'subtree')", name=op.f("ck_quota_usages_scope_type_known")
        ),
        sa.CheckConstraint(
            "(scope_type = 'subtree' AND hard_limit IS NOT NULL) "
            "OR (scope_type = 'queue' AND hard_limit IS NULL)",
            name=op.f("ck_quota_usages_limit_only_on_subtree"),
        ),
        comment="Usage counters. available = hard_limit - (in_use + reserved) on subtree rows.",
    )
    op.create_table(
        "reservations",
        sa.Column("id", sa.String(36), nullable=False, comment="UUID returned to the caller"),
        sa.Column("partition", _name(64), nullable=False),
        sa.Column("key", _name(255), nullable=True, comment="caller's idempotency key"),
        sa.Column("request_hash", sa.String(64), nullable=False, comment="sha256 of the request, for keys"),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("queue", _name(255), nullable=False),
        sa.Column("user_name", _name(255), nullable=True),
        sa.Column("groups", sa.Text(), nullable=True, comment="JSON list of the user's groups"),
        sa.Column("application", _name(255), nullable=True),
        sa.Column("priority_class", _name(255), nullable=True),
        sa.Column("created_at", _ts(), nullable=False),
        sa.Column("expires_at", _ts(), nullable=False),
        sa.Column("resolved_at", _ts(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_reservations")),
        sa.UniqueConstraint("partition", "key", name=op.f("uq_reservations_partition_key")),
        sa.CheckConstraint(
            "state IN ('pending', 'committed', 'rolled_back', 'expired')",
            name=op.f("ck_reservations_state_known"),
        ),
        sa.CheckConstraint(
            "(state = 'pending' AND resolved_at IS NULL) OR (state <> 'pending' AND resolved_at IS NOT NULL)",
            name=op.f("ck_reservations_resolved_when_not_pending"),
        ),
        comment="Reservation headers; per-resource amounts are in reservation_items.",
    )
    op.create_index(
        op.f("ix_reservations_partition_state_expires_at"),
        "reservations",
        ["partition", "state", "expires_at"],
    )
    op.create_table(
        "reservation_items",
        sa.Column("reservation_id", sa.String(36), nullable=False),
        sa.Column("resource", _name(253), nullable=False),
        sa.Column("amount", sa.BigInteger(), nullable=False, comment="reserved, base units"),
        sa.Column("committed", sa.BigInteger(), nullable=True, comment="moved to in_use at commit"),
        sa.ForeignKeyConstraint(
            ["reservation_id"],
            ["reservations.id"],
            name=op.f("fk_reservation_items_reservation_id_reservations"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("reservation_id", "resource", name=op.f("pk_reservation_items")),
        sa.CheckConstraint("amount > 0", name=op.f("ck_reservation_items_amount_positive")),
        sa.CheckConstraint(
            "committed IS NULL OR (committed >= 0 AND committed <= amount)",
            name=op.f("ck_reservation_items_committed_in_range"),
        ),
    )
    op.create_table(
        "quota_journal",
        sa.Column("id", _BIG_ID, autoincrement=True, nullable=False),
        sa.Column("partition", _name(64), nullable=False),
        sa.Column("queue", _name(255), nullable=False),
        sa.Column("resource", _name(253), nullable=False),
        sa.Column("delta", sa.BigInteger(), nullable=False, comment="change of in_use at queue, base units"),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("reservation_id", sa.String(36), nullable=True, comment="for commits"),
        sa.Column("operation_id", sa.String(36), nullable=False, comment="one id per API call"),
        sa.Column("created_at", _ts(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_quota_journal")),
        sa.CheckConstraint("kind IN ('commit', 'release')", name=op.f("ck_quota_journal_kind_known")),
        sa.CheckConstraint(
            "(kind = 'commit' AND delta > 0) OR (kind = 'release' AND delta < 0)",
            name=op.f("ck_quota_journal_delta_sign"),
        ),
        comment="Append-only: every change of in_use. SUM(delta) per queue/resource = in_use.",
    )
    op.create_index(op.f("ix_quota_journal_operation_id"), "quota_journal", ["operation_id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_quota_journal_operation_id"), table_name="quota_journal")
    op.drop_table("quota_journal")
    op.drop_table("reservation_items")
    op.drop_index(op.f("ix_reservations_partition_state_expires_at"), table_name="reservations")
    op.drop_table("reservations")
    op.drop_table("quota_usages")
    op.drop_table("quota_partitions")
