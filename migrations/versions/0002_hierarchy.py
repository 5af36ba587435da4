"""Queue configuration, user and group limits, applications and their usage summaries.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0002"
down_revision = "0001"
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
_EMPTY = '{"partitions": [{"name": "default", "queues": [{"name": "root"}]}]}'


def upgrade() -> None:
    head = op.create_table(
        "quota_config_head",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False, comment="always 1"),
        sa.Column("version", sa.Integer(), nullable=False, comment="the configuration in force"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_quota_config_head")),
        sa.CheckConstraint("id = 1", name=op.f("ck_quota_config_head_single_row")),
        comment="The one row config writers lock; reservations read the version in force.",
    )
    configs = op.create_table(
        "quota_configs",
        sa.Column("version", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("document", sa.Text(), nullable=False, comment="YuniKorn queue configuration, JSON"),
        sa.Column(
            "capacity", sa.Text(), nullable=False, comment="JSON {partition: {resource: limit}} on root"
        ),
        sa.Column(
            "kube",
            sa.Text(),
            nullable=False,
            comment="JSON {partition: {quotas: {ns/name: {queue, manifest}}, admission: manifest}}",
        ),
        sa.Column("created_at", _ts(), nullable=False),
        sa.PrimaryKeyConstraint("version", name=op.f("pk_quota_configs")),
        comment="Every configuration ever applied; quota_config_head names the one in force.",
    )
    op.create_table(
        "quota_identity_usages",
        sa.Column("id", _BIG_ID, autoincrement=True, nullable=False),
        sa.Column("partition", _name(64), nullable=False),
        sa.Column("kind", sa.String(8), nullable=False, comment="user, group or quota (a ResourceQuota)"),
        sa.Column("name", _name(188), nullable=False, comment="user or group (* is shared), or ns/quota"),
        sa.Column("queue", _name(255), nullable=False, comment="the configured queue the limit is on"),
        sa.Column("resource", _name(253), nullable=False, comment="or 'applications' (running count)"),
        sa.Column("in_use", sa.BigInteger(), nullable=False, comment="this name's usage below queue"),
        sa.Column("reserved", sa.BigInteger(), nullable=False),
        sa.Column("hard_limit", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", _ts(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_quota_identity_usages")),
        sa.UniqueConstraint(
            "partition",
            "kind",
            "name",
            "queue",
            "resource",
            name=op.f("uq_quota_identity_usages_partition_kind_name_queue_resource"),
        ),
        sa.CheckConstraint("in_use >= 0", name=op.f("ck_quota_identity_usages_in_use_nonnegative")),
        sa.CheckConstraint("reserved >= 0", name=op.f("ck_quota_identity_usages_reserved_nonnegative")),
        sa.CheckConstraint("hard_limit >= 0", name=op.f("ck_quota_identity_usages_hard_limit_nonnegative")),
        sa.CheckConstraint(
            "kind IN ('user', 'group', 'quota')", name=op.f("ck_quota_identity_usages_kind_known")
        ),
        comment="User, group and ResourceQuota limits: one row per enforced (name, queue, resource).",
    )
    op.create_table(
        "quota_applications",
        sa.Column("id", _BIG_ID, autoincrement=True, nullable=False),
        sa.Column("partition", _name(64), nullable=False),
        sa.Column(
            "app_key",
            _name(640),
            nullable=False,
            comment="the application id, or TAB user TAB queue for a user's reservations without one",
        ),
        sa.Column("application", _name(255), nullable=True, comment="NULL for the per-user bucket"),
        sa.Column("user_name", _name(255), nullable=True),
        sa.Column("queue", _name(255), nullable=False),
        sa.Column("group_name", _name(255), nullable=True, comment="group tracked against; NULL = none"),
        sa.Column("state", sa.String(16), nullable=False, comment="running or finished"),
        sa.Column("pending", sa.Integer(), nullable=False, comment="pending reservations"),
        sa.Column("usage", sa.Text(), nullable=False, comment="JSON {resource: [in_use, reserved]}"),
        sa.Column("area", sa.Text(), nullable=False, comment="JSON {resource: in_use x microseconds}"),
        sa.Column("submitted_at", _ts(), nullable=False),
        sa.Column("started_at", _ts(), nullable=True, comment="first commit"),
        sa.Column("finished_at", _ts(), nullable=True),
        sa.Column("changed_at", _ts(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_quota_applications")),
        sa.UniqueConstraint("partition", "app_key", name=op.f("uq_quota_applications_partition_app_key")),
        sa.CheckConstraint(
            "state IN ('running', 'finished')", name=op.f("ck_quota_applications_state_known")
        ),
        sa.CheckConstraint("pending >= 0", name=op.f("ck_quota_applications_pending_nonnegative")),
        comment="Per-application usage: the source of user and group usage reports.",
    )
    op.create_index(
        op.f("ix_quota_applications_partition_user_name"), "quota_applications", ["partition", "user_name"]
    )
    op.create_index(
        op.f("ix_quota_applications_partition_group_name"), "quota_applications", ["partition", "group_name"]
    )
    op.create_table(
        "quota_app_summaries",
        sa.Column("id", _BIG_ID, autoincrement=True, nullable=False),
        sa.Column("partition", _name(64), nullable=False),
        sa.Column("application", _name(255), nullable=False),
        sa.Column("summary", sa.Text(), nullable=False, comment="JSON, as logged after QUOTA_APP_SUMMARY:"),
        sa.Column("finished_at", _ts(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_quota_app_summaries")),
        comment="One row per finished application run: resource usage integrated over time.",
    )
    op.create_index(
        op.f("ix_quota_app_summaries_partition_application"),
        "quota_app_summaries",
        ["partition", "application"],
    )
    op.create_table(
        "quota_namespaces",
        sa.Column("partition", _name(64), nullable=False),
        sa.Column("namespace", _name(63), nullable=False, comment="Kubernetes namespace"),
        sa.Column("queue", _name(255), nullable=False, comment="the queue it is placed on"),
        sa.Column("updated_at", _ts(), nullable=False),
        sa.PrimaryKeyConstraint("partition", "namespace", name=op.f("pk_quota_namespaces")),
        comment="Where apply_namespace placed each Kubernetes namespace.",
    )
    # Version 0: the empty configuration, so there is always a row to lock and to read.
    now = datetime(2026, 1, 1)
    op.bulk_insert(
        configs, [{"version": 0, "document": _EMPTY, "capacity": "{}", "kube": "{}", "created_at": now}]
    )
    # Kubernetes scope attributes and quota usage of each reservation, and when a committed
    # reservation was released as a whole (release_reservation / release_pod).
    op.add_column(
        "reservations",
        sa.Column("kube", sa.Text(), nullable=True, comment="JSON {usage, scopes} for ResourceQuotas"),
    )
    op.add_column("reservations", sa.Column("released_at", _ts(), nullable=True))
    op.create_index(op.f("ix_reservations_partition_queue"), "reservations", ["partition", "queue"])
    op.bulk_insert(head, [{"id": 1, "version": 0}])


def downgrade() -> None:
    op.drop_index(op.f("ix_reservations_partition_queue"), table_name="reservations")
    with op.batch_alter_table("reservations") as batch:
        batch.drop_column("released_at")
        batch.drop_column("kube")
    op.drop_table("quota_namespaces")
    op.drop_index(op.f("ix_quota_app_summaries_partition_application"), table_name="quota_app_summaries")
    op.drop_table("quota_app_summaries")
    op.drop_index(op.f("ix_quota_applications_partition_group_name"), table_name="quota_applications")
    op.drop_index(op.f("ix_quota_applications_partition_user_name"), table_name="quota_applications")
    op.drop_table("quota_applications")
    op.drop_table("quota_identity_usages")
    op.drop_table("quota_configs")
    op.drop_table("quota_config_head")
