"""Tenants' fair-share weight; a job's usage (trainer-seconds, generated and
eval tokens).

Revision ID: 0004_weights_usage
Revises: 0003_evals
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004_weights_usage"
down_revision: str | None = "0003_evals"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("tenants") as t:
        t.add_column(
            sa.Column("weight", sa.Float(), nullable=False, server_default="1.0")
        )
    with op.batch_alter_table("jobs") as j:
        j.add_column(
            sa.Column("trainer_s", sa.Float(), nullable=False, server_default="0")
        )
        j.add_column(
            sa.Column(
                "generated_tokens", sa.Integer(), nullable=False, server_default="0"
            )
        )
        j.add_column(
            sa.Column("eval_tokens", sa.Integer(), nullable=False, server_default="0")
        )


def downgrade() -> None:
    with op.batch_alter_table("jobs") as j:
        j.drop_column("eval_tokens")
        j.drop_column("generated_tokens")
        j.drop_column("trainer_s")
    with op.batch_alter_table("tenants") as t:
        t.drop_column("weight")
