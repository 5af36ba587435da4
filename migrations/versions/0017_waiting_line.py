"""Requests that wait for capacity: the ``waiting`` state and the columns of the line.

A request that does not fit may wait (``reserve(wait=...)``): its row is a reservation in the new
state ``waiting`` that holds nothing, ordered in its partition's line by ``priority`` (higher
first), then ``queued_at`` (arrival), then ``id``. ``ttl_ms`` is the ttl its grant starts;
the grant clears it, so a row with ``ttl_ms`` set that is no longer waiting left the line
without ever holding anything. ``blocked_by`` holds the limits that stopped it when it was last
tried: the lines it waits in (a ``StrictFIFO`` line lets no later request pass it). A waiting row is unresolved (``resolved_at`` is NULL) and its
``expires_at`` is when its wait runs out. The line's index is partial where the engine has
partial indexes (PostgreSQL, SQLite): rows that never wait add no entry to it.

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

_STATES = "ck_reservations_state_known"
_RESOLVED = "ck_reservations_resolved_when_not_pending"
_LINE = "ix_reservations_partition_state_priority_queued_at"


def _ts() -> sa.types.TypeEngine[object]:
    return sa.DateTime().with_variant(sa.dialects.mysql.DATETIME(fsp=6), "mysql", "mariadb")


def _checks(states: str, unresolved: str) -> tuple[str, str]:
    return (
        f"state IN ({states})",
        f"(state IN ({unresolved}) AND resolved_at IS NULL)"
        f" OR (state NOT IN ({unresolved}) AND resolved_at IS NOT NULL)",
    )


_NEW = _checks("'pending', 'waiting', 'committed', 'rolled_back', 'expired'", "'pending', 'waiting'")
_OLD = (
    "state IN ('pending', 'committed', 'rolled_back', 'expired')",
    "(state = 'pending' AND resolved_at IS NULL) OR (state <> 'pending' AND resolved_at IS NOT NULL)",
)


def _replace_checks(checks: tuple[str, str]) -> None:
    with op.batch_alter_table("reservations") as batch:
        batch.drop_constraint(op.f(_STATES), type_="check")
        batch.drop_constraint(op.f(_RESOLVED), type_="check")
        batch.create_check_constraint(op.f(_STATES), sa.text(checks[0]))
        batch.create_check_constraint(op.f(_RESOLVED), sa.text(checks[1]))


def upgrade() -> None:
    engine = op.get_bind().dialect.name
    with op.batch_alter_table("reservations") as batch:
        batch.add_column(
            sa.Column(
                "priority",
                sa.Integer(),
                nullable=False,
                server_default="0",
                comment="a waiting request's priority: higher is granted first",
            )
        )
        batch.add_column(sa.Column("queued_at", _ts(), nullable=True, comment="when it joined the line"))
        batch.add_column(
            sa.Column(
                "ttl_ms", sa.BigInteger(), nullable=True, comment="the ttl its grant starts; cleared by it"
            )
        )
        batch.add_column(
            sa.Column("blocked_by", sa.Text(), nullable=True, comment="JSON: the limits that stopped it last")
        )
    _replace_checks(_NEW)
    partial = {}
    if engine in ("postgresql", "sqlite"):
        where = sa.text("state = 'waiting'")
        partial = {"postgresql_where": where, "sqlite_where": where}
    op.create_index(_LINE, "reservations", ["partition", "state", "priority", "queued_at"], **partial)


def downgrade() -> None:
    waiting = "SELECT id FROM reservations WHERE state = 'waiting'"
    op.execute(f"DELETE FROM reservation_items WHERE reservation_id IN ({waiting})")  # noqa: S608
    op.execute("DELETE FROM reservations WHERE state = 'waiting'")
    op.drop_index(_LINE, table_name="reservations")
    _replace_checks(_OLD)
    with op.batch_alter_table("reservations") as batch:
        batch.drop_column("blocked_by")
        batch.drop_column("ttl_ms")
        batch.drop_column("queued_at")
        batch.drop_column("priority")
