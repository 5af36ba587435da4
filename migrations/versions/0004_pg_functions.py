"""PostgreSQL: the common reserve, commit and expiry transactions as server-side functions.

Each function is one statement, run as its own transaction: no lock is held across a network
round trip, and a reserve+commit pair costs two round trips instead of eighteen. They cover
the plain case only (no user, groups or application, counters that exist, the configuration
version the caller compiled, which also decided the ResourceQuotas to charge) and *decline* everything else by raising SQLSTATE
``QL001`` before any change survives; the driver then runs the general Python path, which
remains the one source of truth for refusals and errors. Lock order is the canonical one:
partition (advisory, shared) -> reservation rows -> queue counters -> subtree counters.

The functions' text is in ``quota_ledger/driver/sql``, or frozen in ``migrations/sql``. MariaDB and
SQLite get nothing here.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22
"""

from __future__ import annotations

from alembic import op

from quota_ledger.driver import sql

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

# the definitions this revision installs, in dependency order: the helpers as they are today
# (quota_ledger/driver/sql); the reserve function of this revision, which 0010 replaced, the
# commit function, which 0016 dropped, and the expiry function, which 0005 replaced, frozen
# (migrations/sql)
_CURRENT = ("lineage", "enter", "check_updated")
_FROZEN = ("reserve_v1", "commit_v1", "expire_v1")

_COUNTER_TABLES = ("quota_usages", "quota_identity_usages")
_FUNCTIONS = (
    "quota_ledger_expire(text, integer, text[], integer, integer, integer)",
    "quota_ledger_commit(text, text)",
    "quota_ledger_reserve(text, text, text, text, text, text[], bigint[], bigint, text, text, integer,"
    " integer, integer, text[], text[], bigint[], text, text, text, text, text, text[], text[], text[],"
    " text[], bigint[])",
    "quota_ledger_check_updated(integer, tid[])",
    "quota_ledger_enter(integer, integer, integer)",
    "quota_ledger_lineage(text)",
)


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for name in _CURRENT:
        op.execute(sql.definition(name))
    for name in _FROZEN:
        op.execute(sql.frozen(name))
    # Room on each page for the new version of an updated counter row: the update stays on
    # the page (HOT) and touches no index (in_use, reserved and updated_at are not indexed).
    for table in _COUNTER_TABLES:
        op.execute(f"ALTER TABLE {table} SET (fillfactor = 70)")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table in _COUNTER_TABLES:
        op.execute(f"ALTER TABLE {table} RESET (fillfactor)")
    for signature in _FUNCTIONS:
        op.execute(f"DROP FUNCTION IF EXISTS {signature}")
