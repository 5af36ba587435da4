"""Tokens of the admission role: they may call the admission webhook and nothing else.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

_ROLES = "role IN ('reader', 'service', 'admin', 'admission')"
_ROLES_BEFORE = "role IN ('reader', 'service', 'admin')"


def _roles(check: str, comment: str, before: str) -> None:
    with op.batch_alter_table("quota_tokens") as batch:
        batch.drop_constraint(op.f("ck_quota_tokens_role_known"), type_="check")
        batch.create_check_constraint(op.f("ck_quota_tokens_role_known"), sa.text(check))
        batch.alter_column(
            "role",
            existing_type=sa.String(16),
            existing_nullable=False,
            comment=comment,
            existing_comment=before,
        )


def upgrade() -> None:
    _roles(_ROLES, "reader, service, admin or admission", "reader, service or admin")


def downgrade() -> None:
    op.execute(sa.text("DELETE FROM quota_tokens WHERE role = 'admission'"))
    _roles(_ROLES_BEFORE, "reader, service or admin", "reader, service, admin or admission")
