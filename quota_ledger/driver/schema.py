"""The ledger's tables, named for DBAs. Alembic migrations are checked against this metadata."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    UniqueConstraint,
)
from sqlalchemy.dialects import mysql
from sqlalchemy.types import TypeEngine

# Stable constraint names, so migrations and DBAs can refer to them.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING_CONVENTION)


def name_type(length: int) -> TypeEngine[str]:
    """A name column compared byte by byte on every engine.

    Binary collation keeps names case-sensitive and makes the subtree range
    ``[q + ".", q + "/")`` exact (PostgreSQL's default collations ignore punctuation).
    """
    return (
        String(length)
        .with_variant(String(length, collation="C"), "postgresql")
        .with_variant(mysql.VARCHAR(length, charset="utf8mb4", collation="utf8mb4_bin"), "mysql", "mariadb")
    )


def timestamp_type() -> TypeEngine[datetime]:
    """Naive UTC timestamps with microseconds (MariaDB's DATETIME defaults to whole seconds)."""
    return DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")


# SQLite only auto-increments an INTEGER PRIMARY KEY, so BIGINT ids are INTEGER there.
BigId = BigInteger().with_variant(Integer(), "sqlite")

quota_partitions = Table(
    "quota_partitions",
    metadata,
    Column("name", name_type(64), primary_key=True, comment="partition; the unit of admin locking"),
    Column("created_at", timestamp_type(), nullable=False),
    comment="One row per partition. Reservations take it shared, limit changes exclusively.",
)

quota_usages = Table(
    "quota_usages",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("partition", name_type(64), nullable=False),
    Column(
        "scope_type",
        String(16),
        nullable=False,
        comment="queue: usage charged to exactly this queue; subtree: this queue and all below it",
    ),
    Column("scope", name_type(255), nullable=False, comment="queue path, e.g. root.a.b"),
    Column("resource", name_type(253), nullable=False),
    Column("in_use", BigInteger, nullable=False, default=0, comment="committed usage, base units"),
    Column("reserved", BigInteger, nullable=False, default=0, comment="pending reservations"),
    Column("hard_limit", BigInteger, nullable=True, comment="NULL = unlimited; subtree rows only"),
    Column("updated_at", timestamp_type(), nullable=False),
    UniqueConstraint("partition", "scope_type", "scope", "resource"),
    CheckConstraint("in_use >= 0", name="in_use_nonnegative"),
    CheckConstraint("reserved >= 0", name="reserved_nonnegative"),
    CheckConstraint("hard_limit IS NULL OR hard_limit >= 0", name="hard_limit_nonnegative"),
    CheckConstraint("scope_type IN ('queue', 'subtree')", name="scope_type_known"),
    CheckConstraint(
        "(scope_type = 'subtree' AND hard_limit IS NOT NULL) "
        "OR (scope_type = 'queue' AND hard_limit IS NULL)",
        name="limit_only_on_subtree",
    ),
    comment="Usage counters. available = hard_limit - (in_use + reserved) on subtree rows.",
)

reservations = Table(
    "reservations",
    metadata,
    Column("id", String(36), primary_key=True, comment="UUID returned to the caller"),
    Column("partition", name_type(64), nullable=False),
    Column("key", name_type(255), nullable=True, comment="caller's idempotency key"),
    Column("request_hash", String(64), nullable=False, comment="sha256 of the request, for keys"),
    Column("state", String(16), nullable=False),
    Column("queue", name_type(255), nullable=False),
    Column("user_name", name_type(255), nullable=True),
    Column("groups", Text, nullable=True, comment="JSON list of the user's groups"),
    Column("application", name_type(255), nullable=True),
    Column("priority_class", name_type(255), nullable=True),
    Column("created_at", timestamp_type(), nullable=False),
    Column("expires_at", timestamp_type(), nullable=False),
    Column("resolved_at", timestamp_type(), nullable=True),
    UniqueConstraint("partition", "key"),
    CheckConstraint("state IN ('pending', 'committed', 'rolled_back', 'expired')", name="state_known"),
    CheckConstraint(
        "(state = 'pending' AND resolved_at IS NULL) OR (state <> 'pending' AND resolved_at IS NOT NULL)",
        name="resolved_when_not_pending",
    ),
    Index(None, "partition", "state", "expires_at"),
    comment="Reservation headers; per-resource amounts are in reservation_items.",
)

reservation_items = Table(
    "reservation_items",
    metadata,
    Column(
        "reservation_id",
        String(36),
        ForeignKey("reservations.id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("resource", name_type(253), nullable=False),
    Column("amount", BigInteger, nullable=False, comment="reserved, base units"),
    Column("committed", BigInteger, nullable=True, comment="moved to in_use at commit"),
    PrimaryKeyConstraint("reservation_id", "resource"),
    CheckConstraint("amount > 0", name="amount_positive"),
    CheckConstraint(
        "committed IS NULL OR (committed >= 0 AND committed <= amount)", name="committed_in_range"
    ),
)

quota_journal = Table(
    "quota_journal",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("partition", name_type(64), nullable=False),
    Column("queue", name_type(255), nullable=False),
    Column("resource", name_type(253), nullable=False),
    Column("delta", BigInteger, nullable=False, comment="change of in_use at queue, base units"),
    Column("kind", String(16), nullable=False),
    Column("reservation_id", String(36), nullable=True, comment="for commits"),
    Column("operation_id", String(36), nullable=False, comment="one id per API call"),
    Column("created_at", timestamp_type(), nullable=False),
    CheckConstraint("kind IN ('commit', 'release')", name="kind_known"),
    CheckConstraint("(kind = 'commit' AND delta > 0) OR (kind = 'release' AND delta < 0)", name="delta_sign"),
    Index(None, "operation_id"),
    comment="Append-only: every change of in_use. SUM(delta) per queue/resource = in_use.",
)
