"""Configuration changes of one queue's max, recorded without copying the whole configuration.

``set_limits`` used to store the whole configuration document as a new ``quota_configs`` row
for each call. It now records the resources it changes in ``quota_config_changes`` (version,
partition, queue, resource, new limit or NULL when removed); ``quota_configs`` keeps a whole
snapshot for every ``apply_config`` and Kubernetes objects edit. Version V is the newest
snapshot at or below V with the changes above it up to V applied. Existing rows stay as they
are: each is a snapshot.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-24
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

from quota_ledger.config import queue_max

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def _name(length: int) -> sa.types.TypeEngine[str]:
    # quota_ledger.driver.schema.name_type, frozen
    return (
        sa.String(length)
        .with_variant(sa.String(length, collation="C"), "postgresql")
        .with_variant(mysql.VARCHAR(length, charset="utf8mb4", collation="utf8mb4_bin"), "mysql", "mariadb")
    )


def _comments() -> bool:
    return op.get_bind().dialect.name != "sqlite"  # SQLite keeps no table comments


def upgrade() -> None:
    op.create_table(
        "quota_config_changes",
        sa.Column("version", sa.Integer(), nullable=False, comment="the configuration version it made"),
        sa.Column("partition", _name(64), nullable=False),
        sa.Column("queue", _name(255), nullable=False, comment="the queue whose max changed; root: capacity"),
        sa.Column("resource", _name(253), nullable=False),
        sa.Column(
            "hard_limit", sa.BigInteger(), nullable=True, comment="the new limit (base units); NULL: removed"
        ),
        sa.Column(
            "created_at",
            sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("version", "partition", "queue", "resource", name="pk_quota_config_changes"),
        comment=(
            "One queue's max set by set_limits, one row per resource, without copying the whole "
            "configuration."
        ),
    )
    if _comments():
        op.create_table_comment(
            "quota_configs",
            "Whole configurations: every apply_config and Kubernetes objects edit. Version V in force "
            "is the newest row with version <= V plus quota_config_changes in (that version, V].",
            existing_comment="Every configuration ever applied; quota_config_head names the one in force.",
        )


def downgrade() -> None:
    _keep_head_as_snapshot()
    if _comments():
        op.create_table_comment(
            "quota_configs",
            "Every configuration ever applied; quota_config_head names the one in force.",
            existing_comment=(
                "Whole configurations: every apply_config and Kubernetes objects edit. Version V in "
                "force is the newest row with version <= V plus quota_config_changes in (that version, V]."
            ),
        )
    op.drop_table("quota_config_changes")


def _keep_head_as_snapshot() -> None:
    """Store the version in force as a whole snapshot when it was made by changes, so that
    the older schema, which reads only snapshots, finds it."""
    bind = op.get_bind()
    head = bind.execute(sa.text("SELECT version FROM quota_config_head WHERE id = 1")).scalar()
    if (
        not head
        or bind.execute(sa.text("SELECT 1 FROM quota_configs WHERE version = :v"), {"v": head}).first()
    ):
        return
    row = bind.execute(
        sa.text(
            "SELECT version, document, capacity, kube FROM quota_configs WHERE version = "
            "(SELECT MAX(version) FROM quota_configs WHERE version < :v)"
        ),
        {"v": head},
    ).one()
    changed = sa.table(
        "quota_config_changes",
        *(sa.column(n) for n in ("version", "partition", "queue", "resource", "hard_limit", "created_at")),
    )
    c = changed.c
    rows = bind.execute(
        sa.select(c.version, c.partition, c.queue, c.resource, c.hard_limit).where(
            c.version > row.version, c.version <= head
        )
    )
    changes = [queue_max.LimitChange(r.version, r.partition, r.queue, r.resource, r.hard_limit) for r in rows]
    document, capacity = queue_max.replay(json.loads(row.document), json.loads(row.capacity), changes)
    created = bind.execute(sa.select(sa.func.max(c.created_at)).where(c.version == head)).scalar()
    configs = sa.table(
        "quota_configs", *(sa.column(n) for n in ("version", "document", "capacity", "kube", "created_at"))
    )
    bind.execute(
        configs.insert().values(
            version=head,
            document=json.dumps(document, sort_keys=True),
            capacity=json.dumps(capacity, sort_keys=True),
            kube=row.kube,
            created_at=created,
        )
    )
