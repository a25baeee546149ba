"""Initial schema: tenants, api_keys, files, jobs, job_actions, events, checkpoints.

Revision ID: 0001
Revises:
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "tenants",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("disabled", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tenants")),
        sa.UniqueConstraint("name", name=op.f("uq_tenants_name")),
    )
    op.create_table(
        "api_keys",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("key_hash", sa.String(length=64), nullable=False),
        sa.Column("prefix", sa.String(length=32), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("revoked_at", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_api_keys_tenant_id_tenants")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_keys")),
        sa.UniqueConstraint("key_hash", name=op.f("uq_api_keys_key_hash")),
        sqlite_autoincrement=True,
    )
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_api_keys_tenant_id"), ["tenant_id"], unique=False
        )

    op.create_table(
        "files",
        sa.Column("seq", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("filename", sa.String(length=255), nullable=False),
        sa.Column("purpose", sa.String(length=32), nullable=False),
        sa.Column("bytes", sa.Integer(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("lines", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("path", sa.String(length=255), nullable=False),
        sa.Column("deleted_at", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_files_tenant_id_tenants")
        ),
        sa.PrimaryKeyConstraint("seq", name=op.f("pk_files")),
        sa.UniqueConstraint("id", name=op.f("uq_files_id")),
        sqlite_autoincrement=True,
    )
    with op.batch_alter_table("files", schema=None) as batch_op:
        batch_op.create_index("ix_files_tenant_seq", ["tenant_id", "seq"], unique=False)

    op.create_table(
        "jobs",
        sa.Column("seq", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("model", sa.String(length=255), nullable=False),
        sa.Column("training_file", sa.String(length=40), nullable=False),
        sa.Column("validation_file", sa.String(length=40), nullable=True),
        sa.Column("status", sa.String(length=32), nullable=False),
        sa.Column("method", sa.JSON(none_as_null=True), nullable=False),
        sa.Column("hyperparameters", sa.JSON(none_as_null=True), nullable=False),
        sa.Column("metadata", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("seed", sa.Integer(), nullable=False),
        sa.Column("suffix", sa.String(length=64), nullable=True),
        sa.Column("fine_tuned_model", sa.String(length=255), nullable=True),
        sa.Column("task_name", sa.String(length=48), nullable=False),
        sa.Column("error", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=True),
        sa.Column("first_step_at", sa.Float(), nullable=True),
        sa.Column("finished_at", sa.Float(), nullable=True),
        sa.Column("ttfs_s", sa.Float(), nullable=True),
        sa.Column("trained_tokens", sa.Integer(), nullable=True),
        sa.Column("steps_total", sa.Integer(), nullable=False),
        sa.Column("steps_done", sa.Integer(), nullable=False),
        sa.Column("result_files", sa.JSON(none_as_null=True), nullable=False),
        sa.Column("estimated_finish", sa.Float(), nullable=True),
        sa.Column("idempotency_key", sa.String(length=255), nullable=True),
        sa.Column("request_sha256", sa.String(length=64), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_jobs_tenant_id_tenants")
        ),
        sa.ForeignKeyConstraint(
            ["training_file"], ["files.id"], name=op.f("fk_jobs_training_file_files")
        ),
        sa.ForeignKeyConstraint(
            ["validation_file"],
            ["files.id"],
            name=op.f("fk_jobs_validation_file_files"),
        ),
        sa.PrimaryKeyConstraint("seq", name=op.f("pk_jobs")),
        sa.UniqueConstraint("id", name=op.f("uq_jobs_id")),
        sa.UniqueConstraint("task_name", name=op.f("uq_jobs_task_name")),
        sa.UniqueConstraint(
            "tenant_id",
            "idempotency_key",
            name=op.f("uq_jobs_tenant_id_idempotency_key"),
        ),
        sqlite_autoincrement=True,
    )
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.create_index("ix_jobs_status_seq", ["status", "seq"], unique=False)
        batch_op.create_index("ix_jobs_tenant_seq", ["tenant_id", "seq"], unique=False)

    op.create_table(
        "checkpoints",
        sa.Column("seq", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("job_id", sa.String(length=40), nullable=False),
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("step_number", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("fine_tuned_model_checkpoint", sa.String(length=255), nullable=False),
        sa.Column("adapter_path", sa.String(length=512), nullable=False),
        sa.Column("metrics", sa.JSON(none_as_null=True), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_checkpoints_job_id_jobs")
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_checkpoints_tenant_id_tenants")
        ),
        sa.PrimaryKeyConstraint("seq", name=op.f("pk_checkpoints")),
        sa.UniqueConstraint(
            "fine_tuned_model_checkpoint",
            name=op.f("uq_checkpoints_fine_tuned_model_checkpoint"),
        ),
        sa.UniqueConstraint("id", name=op.f("uq_checkpoints_id")),
        sa.UniqueConstraint(
            "job_id", "step_number", name=op.f("uq_checkpoints_job_id_step_number")
        ),
        sqlite_autoincrement=True,
    )
    with op.batch_alter_table("checkpoints", schema=None) as batch_op:
        batch_op.create_index("ix_checkpoints_tenant_id", ["tenant_id"], unique=False)

    op.create_table(
        "events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=40), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("level", sa.String(length=8), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("type", sa.String(length=16), nullable=False),
        sa.Column("data", sa.JSON(none_as_null=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_events_job_id_jobs")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_events")),
        sqlite_autoincrement=True,
    )
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.create_index("ix_events_job_id_id", ["job_id", "id"], unique=False)

    op.create_table(
        "job_actions",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=40), nullable=False),
        sa.Column("action", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("handled_at", sa.Float(), nullable=True),
        sa.Column("outcome", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_job_actions_job_id_jobs")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_actions")),
        sqlite_autoincrement=True,
    )
    with op.batch_alter_table("job_actions", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_job_actions_job_id"), ["job_id"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("job_actions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_job_actions_job_id"))

    op.drop_table("job_actions")
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.drop_index("ix_events_job_id_id")

    op.drop_table("events")
    with op.batch_alter_table("checkpoints", schema=None) as batch_op:
        batch_op.drop_index("ix_checkpoints_tenant_id")

    op.drop_table("checkpoints")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_tenant_seq")
        batch_op.drop_index("ix_jobs_status_seq")

    op.drop_table("jobs")
    with op.batch_alter_table("files", schema=None) as batch_op:
        batch_op.drop_index("ix_files_tenant_seq")

    op.drop_table("files")
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_api_keys_tenant_id"))

    op.drop_table("api_keys")
    op.drop_table("tenants")
