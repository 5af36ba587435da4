"""The ledger's tables, named for DBAs. Alembic migrations are checked against this metadata."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    ColumnElement,
    Computed,
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
    literal_column,
    text,
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


#: ``state = PENDING`` writes 'pending' into the statement instead of binding it: only then can
#: the planner prove that a query matches the partial pending index.
PENDING: ColumnElement[str] = literal_column("'pending'", String)


def _where(predicate: str) -> dict[str, Any]:
    """A partial index's predicate on the engines that have partial indexes."""
    return {"postgresql_where": text(predicate), "sqlite_where": text(predicate)}


#: ``info`` of a column or index that only some engines have; see :func:`exists_on`
_MARIADB_ONLY = {"dialects": ("mariadb", "mysql")}
_PARTIAL_ONLY = {"dialects": ("postgresql", "sqlite")}


def exists_on(item: Any, dialect: str) -> bool:
    """Whether the migrations make this column or index on ``dialect`` (most are everywhere)."""
    info = getattr(item, "info", None) or {}
    return dialect in info.get("dialects", (dialect,))


_KEY_OR_ID_LENGTH = 255 + 1 + 36  # a key, or a tab and an id

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
    Column("kube", Text, nullable=True, comment="JSON {usage, scopes} for ResourceQuotas"),
    Column("released_at", timestamp_type(), nullable=True),
    Column(
        "priority",
        Integer,
        nullable=False,
        server_default="0",
        comment="a waiting request's priority: higher is granted first",
    ),
    Column("queued_at", timestamp_type(), nullable=True, comment="when it joined the line"),
    Column("ttl_ms", BigInteger, nullable=True, comment="the ttl its grant starts; cleared by it"),
    Column("blocked_by", Text, nullable=True, comment="JSON: the limits that stopped it last"),
    # MariaDB only: what its unique key index holds. A keyed row's key; a keyless row's id
    # behind a tab (a key is printable, so the two never meet). An index on the nullable key
    # would do, but Galera certifies a NULL in a unique index as one value, so keyless rows
    # written at once on two nodes would conflict. Never NULL (MariaDB allows no NOT NULL on
    # a generated column).
    Column(
        "key_or_id",
        name_type(_KEY_OR_ID_LENGTH),
        Computed(text("COALESCE(`key`, CONCAT(CHAR(9 USING utf8mb4), `id`))"), persisted=True),
        comment="MariaDB: key, or TAB + id without one; unique per partition",
        info=_MARIADB_ONLY,
    ),
    CheckConstraint(
        "state IN ('pending', 'waiting', 'committed', 'rolled_back', 'expired')", name="state_known"
    ),
    CheckConstraint(
        "(state IN ('pending', 'waiting') AND resolved_at IS NULL)"
        " OR (state NOT IN ('pending', 'waiting') AND resolved_at IS NOT NULL)",
        name="resolved_when_not_pending",
    ),
    # Partial where the engine has them (PostgreSQL, SQLite): a row leaving 'pending', or one
    # without a key, adds no entry to these: a commit or an expiry writes to the primary key
    # and the resolved index below only (and the key index, for a keyed row).
    Index(
        "uq_reservations_partition_key",
        "partition",
        "key",
        unique=True,
        info=_PARTIAL_ONLY,
        **_where("key IS NOT NULL"),
    ),
    # MariaDB: keys are unique through key_or_id; lookups by key use the plain index.
    Index("uq_reservations_partition_key_or_id", "partition", "key_or_id", unique=True, info=_MARIADB_ONLY),
    Index("ix_reservations_partition_key", "partition", "key", info=_MARIADB_ONLY),
    Index(None, "partition", "state", "expires_at", **_where("state = 'pending'")),
    Index(None, "partition", "queue", "state", "expires_at", **_where("state = 'pending'")),
    # The waiting line, in grant order (partial where the engine has them: rows that never
    # wait add no entry).
    Index(None, "partition", "state", "priority", "queued_at", **_where("state = 'waiting'")),
    # The usage history finds the reservations resolved in its window here. Partial where the
    # engine has them: a new reservation adds no entry, its resolution adds one.
    Index(None, "partition", "resolved_at", **_where("resolved_at IS NOT NULL")),
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
    Index(None, "partition", "created_at"),  # the usage history reads one window of it
    comment="Append-only: every change of in_use. SUM(delta) per queue/resource = in_use.",
)

quota_config_head = Table(
    "quota_config_head",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False, comment="always 1"),
    Column("version", Integer, nullable=False, comment="the configuration in force"),
    CheckConstraint("id = 1", name="single_row"),
    comment="The one row config writers lock; reservations read the version in force.",
)

quota_configs = Table(
    "quota_configs",
    metadata,
    Column("version", Integer, primary_key=True, autoincrement=False),
    Column("document", Text, nullable=False, comment="YuniKorn queue configuration, JSON"),
    Column("capacity", Text, nullable=False, comment="JSON {partition: {resource: limit}} on root"),
    Column(
        "kube",
        Text,
        nullable=False,
        comment="JSON {partition: {quotas: {ns/name: {queue, manifest}}, admission: manifest}}",
    ),
    Column("created_at", timestamp_type(), nullable=False),
    comment=(
        "Whole configurations: every apply_config and Kubernetes objects edit. Version V in force "
        "is the newest row with version <= V plus quota_config_changes in (that version, V]."
    ),
)

quota_config_changes = Table(
    "quota_config_changes",
    metadata,
    Column("version", Integer, nullable=False, comment="the configuration version it made"),
    Column("partition", name_type(64), nullable=False),
    Column("queue", name_type(255), nullable=False, comment="the queue whose max changed; root: capacity"),
    Column("resource", name_type(253), nullable=False),
    Column("hard_limit", BigInteger, nullable=True, comment="the new limit (base units); NULL: removed"),
    Column("created_at", timestamp_type(), nullable=False),
    PrimaryKeyConstraint("version", "partition", "queue", "resource"),
    comment=(
        "One queue's max set by set_limits, one row per resource, without copying the whole configuration."
    ),
)

quota_identity_usages = Table(
    "quota_identity_usages",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("partition", name_type(64), nullable=False),
    Column("kind", String(8), nullable=False, comment="user, group or quota (a ResourceQuota)"),
    Column("name", name_type(188), nullable=False, comment="user or group (* is shared), or ns/quota"),
    Column("queue", name_type(255), nullable=False, comment="the configured queue the limit is on"),
    Column("resource", name_type(253), nullable=False, comment="or 'applications' (running count)"),
    Column("in_use", BigInteger, nullable=False, default=0, comment="this name's usage below queue"),
    Column("reserved", BigInteger, nullable=False, default=0),
    Column("hard_limit", BigInteger, nullable=False),
    Column("updated_at", timestamp_type(), nullable=False),
    UniqueConstraint("partition", "kind", "name", "queue", "resource"),
    CheckConstraint("in_use >= 0", name="in_use_nonnegative"),
    CheckConstraint("reserved >= 0", name="reserved_nonnegative"),
    CheckConstraint("hard_limit >= 0", name="hard_limit_nonnegative"),
    CheckConstraint("kind IN ('user', 'group', 'quota')", name="kind_known"),
    comment="User, group and ResourceQuota limits: one row per enforced (name, queue, resource).",
)

quota_applications = Table(
    "quota_applications",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("partition", name_type(64), nullable=False),
    Column(
        "app_key",
        name_type(640),
        nullable=False,
        comment="the application id, or TAB user TAB queue for a user's reservations without one",
    ),
    Column("application", name_type(255), nullable=True, comment="NULL for the per-user bucket"),
    Column("user_name", name_type(255), nullable=True),
    Column("queue", name_type(255), nullable=False),
    Column("group_name", name_type(255), nullable=True, comment="group tracked against; NULL = none"),
    Column("state", String(16), nullable=False, comment="running or finished"),
    Column("pending", Integer, nullable=False, comment="pending reservations"),
    Column("usage", Text, nullable=False, comment="JSON {resource: [in_use, reserved]}"),
    Column("area", Text, nullable=False, comment="JSON {resource: in_use x microseconds}"),
    Column("submitted_at", timestamp_type(), nullable=False),
    Column("started_at", timestamp_type(), nullable=True, comment="first commit"),
    Column("finished_at", timestamp_type(), nullable=True),
    Column("changed_at", timestamp_type(), nullable=False),
    UniqueConstraint("partition", "app_key"),
    CheckConstraint("state IN ('running', 'finished')", name="state_known"),
    CheckConstraint("pending >= 0", name="pending_nonnegative"),
    # Partial on PostgreSQL: a lookup by (partition, app_key) cannot take them for the unique
    # key's, whatever the statistics when its generic plan was made.
    Index(None, "partition", "user_name", postgresql_where=text("user_name IS NOT NULL")),
    Index(None, "partition", "group_name", postgresql_where=text("group_name IS NOT NULL")),
    comment="Per-application usage: the source of user and group usage reports.",
)

quota_app_summaries = Table(
    "quota_app_summaries",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("partition", name_type(64), nullable=False),
    Column("application", name_type(255), nullable=False),
    Column("summary", Text, nullable=False, comment="JSON, as logged after QUOTA_APP_SUMMARY:"),
    Column("finished_at", timestamp_type(), nullable=False),
    Index(None, "partition", "application"),
    comment="One row per finished application run: resource usage integrated over time.",
)

quota_namespaces = Table(
    "quota_namespaces",
    metadata,
    Column("partition", name_type(64), nullable=False),
    Column("namespace", name_type(63), nullable=False, comment="Kubernetes namespace"),
    Column("queue", name_type(255), nullable=False, comment="the queue it is placed on"),
    Column("updated_at", timestamp_type(), nullable=False),
    PrimaryKeyConstraint("partition", "namespace"),
    comment="Where apply_namespace placed each Kubernetes namespace.",
)

quota_tokens = Table(
    "quota_tokens",
    metadata,
    Column("name", name_type(64), primary_key=True, comment="who holds it, e.g. billing-service"),
    Column("token_hash", String(64), nullable=False, comment="sha256 of the token, never the token"),
    Column("role", String(16), nullable=False, comment="reader, service, admin or admission"),
    Column("partition", name_type(64), nullable=True, comment="restricted to this partition; NULL = any"),
    Column("queue", name_type(255), nullable=True, comment="restricted to this queue's subtree; NULL = any"),
    Column("created_at", timestamp_type(), nullable=False),
    Column("revoked_at", timestamp_type(), nullable=True),
    UniqueConstraint("token_hash"),
    CheckConstraint("role IN ('reader', 'service', 'admin', 'admission')", name="role_known"),
    comment="Bearer tokens of the HTTP service, stored as hashes.",
)
