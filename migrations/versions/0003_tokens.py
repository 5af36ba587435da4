"""Bearer tokens of the HTTP service, stored as hashes.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22
"""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0003"
down_revision = "0002"
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


def upgrade() -> None:
    op.create_table(
        "quota_tokens",
        sa.Column("name", _name(64), nullable=False, comment="who holds it, e.g. billing-service"),
        sa.Column(
            "token_hash", sa.String(64), nullable=False, comment="sha256 of the token, never the token"
        ),
        sa.Column("role", sa.String(16), nullable=False, comment="reader, service or admin"),
        sa.Column("partition", _name(64), nullable=True, comment="restricted to this partition; NULL = any"),
        sa.Column(
            "queue", _name(255), nullable=True, comment="restricted to this queue's subtree; NULL = any"
        ),
        sa.Column("created_at", _ts(), nullable=False),
        sa.Column("revoked_at", _ts(), nullable=True),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_quota_tokens")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_quota_tokens_token_hash")),
        sa.CheckConstraint("role IN ('reader', 'service', 'admin')", name=op.f("ck_quota_tokens_role_known")),
        comment="Bearer tokens of the HTTP service, stored as hashes.",
    )


def downgrade() -> None:
    op.drop_table("quota_tokens")
