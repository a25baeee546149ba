"""The job store's tables (SQLAlchemy 2 ORM). Alembic migrations in
``migrations/versions`` create them; a test checks the two never drift apart.

Objects with public string ids (``ftjob-...``, ``file-...``, ``ftckpt-...``) also
have an integer ``seq`` primary key: it only grows (``sqlite_autoincrement``, a
sequence on PostgreSQL), so lists page stably by it. Times are Unix seconds as
floats (TTFS needs sub-second precision; the API rounds them down).
"""

from __future__ import annotations

import secrets
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# Named constraints, so later migrations (batch mode on SQLite) can address them.
NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# JSON columns store SQL NULL for None (not the JSON literal null), so
# `metadata=null` filters with IS NULL.
Json = JSON(none_as_null=True)

# Job statuses. `paused` is ours (the SDK's literal lacks it; it parses leniently).
VALIDATING = "validating_files"
QUEUED = "queued"
RUNNING = "running"
PAUSED = "paused"
SUCCEEDED = "succeeded"
FAILED = "failed"
CANCELLED = "cancelled"
STATUSES = (VALIDATING, QUEUED, RUNNING, PAUSED, SUCCEEDED, FAILED, CANCELLED)
TERMINAL = frozenset({SUCCEEDED, FAILED, CANCELLED})
ACTIONS = ("cancel", "pause", "resume")
EVENT_LEVELS = ("info", "warn", "error")
EVENT_TYPES = ("message", "metrics")
# Webhook delivery states: retried while `pending`; the others are final.
DELIVERY_PENDING = "pending"
DELIVERY_DELIVERED = "delivered"
DELIVERY_FAILED = "failed"  # every attempt used
DELIVERY_CANCELLED = "cancelled"  # its webhook was removed first


def new_id(prefix: str) -> str:
    """``<prefix>-<24 hex>``: 96 random bits, unguessable across tenants."""
    return f"{prefix}-{secrets.token_hex(12)}"


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class Tenant(Base):
    __tablename__ = "tenants"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[float] = mapped_column(Float)
    disabled: Mapped[bool] = mapped_column(Boolean, default=False)
    # Its share of the trainer under scheduler.train_order=fair.
    weight: Mapped[float] = mapped_column(Float, default=1.0, server_default="1.0")


class ApiKey(Base):
    __tablename__ = "api_keys"
    __table_args__ = {"sqlite_autoincrement": True}

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), index=True)
    # sha256 hex of the key; the key itself is shown once and never stored.
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[float] = mapped_column(Float)
    revoked_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class File(Base):
    __tablename__ = "files"
    __table_args__ = (
        Index("ix_files_tenant_seq", "tenant_id", "seq"),
        {"sqlite_autoincrement": True},
    )

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(40), unique=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"))
    filename: Mapped[str] = mapped_column(String(255))
    purpose: Mapped[str] = mapped_column(String(32))
    bytes: Mapped[int] = mapped_column(Integer)
    sha256: Mapped[str] = mapped_column(String(64))
    lines: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[float] = mapped_column(Float)
    # Relative to the service root; never derived from the uploaded filename.
    path: Mapped[str] = mapped_column(String(255))
    deleted_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        UniqueConstraint("tenant_id", "idempotency_key"),
        Index("ix_jobs_tenant_seq", "tenant_id", "seq"),
        Index("ix_jobs_status_seq", "status", "seq"),
        {"sqlite_autoincrement": True},
    )

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(40), unique=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"))
    model: Mapped[str] = mapped_column(String(255))
    training_file: Mapped[str] = mapped_column(ForeignKey("files.id"))
    validation_file: Mapped[str | None] = mapped_column(
        ForeignKey("files.id"), nullable=True
    )
    status: Mapped[str] = mapped_column(String(32))
    # The method as requested ({type, reinforcement: {grader, hyperparameters}}).
    method: Mapped[dict[str, Any]] = mapped_column(Json)
    # Every hyperparameter resolved ("auto" replaced), plus what the trainer needs:
    # group_size, learning_rate.
    hyperparameters: Mapped[dict[str, Any]] = mapped_column(Json)
    metadata_: Mapped[dict[str, str] | None] = mapped_column(
        "metadata", Json, nullable=True
    )
    seed: Mapped[int] = mapped_column(Integer)
    suffix: Mapped[str | None] = mapped_column(String(64), nullable=True)
    fine_tuned_model: Mapped[str | None] = mapped_column(String(255), nullable=True)
    # Adapter/task name inside the trainer: [a-z0-9_], <= 48 chars (TaskSpec.name).
    task_name: Mapped[str] = mapped_column(String(48), unique=True)
    error: Mapped[dict[str, Any] | None] = mapped_column(Json, nullable=True)
    created_at: Mapped[float] = mapped_column(Float)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    first_step_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    ttfs_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    trained_tokens: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # Usage, summed over its committed steps and evals (the run directory's
    # step and eval records).
    trainer_s: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    generated_tokens: Mapped[int] = mapped_column(
        Integer, default=0, server_default="0"
    )
    eval_tokens: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    steps_total: Mapped[int] = mapped_column(Integer)
    steps_done: Mapped[int] = mapped_column(Integer, default=0)
    result_files: Mapped[list[str]] = mapped_column(Json)
    estimated_finish: Mapped[float | None] = mapped_column(Float, nullable=True)
    # Its eval (``client.evals``), made when a job with a validation file starts.
    eval_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    idempotency_key: Mapped[str | None] = mapped_column(String(255), nullable=True)
    # sha256 of the create body: a reused Idempotency-Key with another body is 409.
    request_sha256: Mapped[str] = mapped_column(String(64))


class JobAction(Base):
    """A tenant's cancel/pause/resume request; the scheduler sets ``handled_at``
    once it applied or ignored it."""

    __tablename__ = "job_actions"
    __table_args__ = {"sqlite_autoincrement": True}

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    action: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[float] = mapped_column(Float)
    handled_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # What the scheduler did ("applied", "ignored: job already finished", ...).
    outcome: Mapped[str | None] = mapped_column(Text, nullable=True)


class Event(Base):
    __tablename__ = "events"
    __table_args__ = (
        Index("ix_events_job_id_id", "job_id", "id"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"))
    created_at: Mapped[float] = mapped_column(Float)
    level: Mapped[str] = mapped_column(String(8))
    message: Mapped[str] = mapped_column(Text)
    type: Mapped[str] = mapped_column(String(16))
    data: Mapped[dict[str, Any] | None] = mapped_column(Json, nullable=True)


class Checkpoint(Base):
    __tablename__ = "checkpoints"
    __table_args__ = (
        UniqueConstraint("job_id", "step_number"),
        Index("ix_checkpoints_tenant_id", "tenant_id"),
        {"sqlite_autoincrement": True},
    )

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(40), unique=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"))
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"))
    step_number: Mapped[int] = mapped_column(Integer)
    # The trainer's adapter version this checkpoint holds (<task>-v<version>).
    version: Mapped[int] = mapped_column(Integer)
    # Its own servable name (chat `model=`), unique across the service.
    fine_tuned_model_checkpoint: Mapped[str] = mapped_column(String(255), unique=True)
    adapter_path: Mapped[str] = mapped_column(String(512))
    metrics: Mapped[dict[str, Any]] = mapped_column(Json)
    created_at: Mapped[float] = mapped_column(Float)


class Webhook(Base):
    """An endpoint the operator registered for a tenant; it receives the tenant's
    job events, signed per Standard Webhooks with ``secret``."""

    __tablename__ = "webhooks"
    __table_args__ = (
        Index("ix_webhooks_tenant_seq", "tenant_id", "seq"),
        {"sqlite_autoincrement": True},
    )

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(40), unique=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"))
    url: Mapped[str] = mapped_column(String(2048))
    # ``whsec_<base64>``, kept in clear: signing needs the key itself (unlike API
    # keys, which are only ever compared).
    secret: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[float] = mapped_column(Float)
    # Soft delete: the delivery log keeps naming the webhook.
    deleted_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class WebhookDelivery(Base):
    """One event for one webhook (the outbox row, inserted in the transaction
    that made the event happen) and its delivery state."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        Index("ix_webhook_deliveries_status_next", "status", "next_attempt_at"),
        Index("ix_webhook_deliveries_tenant_id_id", "tenant_id", "id"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    # The ``webhook-id`` header: the same on every attempt, so receivers dedupe.
    message_id: Mapped[str] = mapped_column(String(40), unique=True)
    event_id: Mapped[str] = mapped_column(String(40))  # the payload's evt_...
    webhook_id: Mapped[str] = mapped_column(ForeignKey("webhooks.id"), index=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"))
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"))
    event_type: Mapped[str] = mapped_column(String(64))
    # The exact body every attempt sends (signatures cover these bytes).
    payload: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[float] = mapped_column(Float)
    # When a dispatcher may take it next (also its lease while an attempt runs).
    next_attempt_at: Mapped[float] = mapped_column(Float)
    last_attempt_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    last_status_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class WebhookAttempt(Base):
    """One POST of a delivery and its outcome."""

    __tablename__ = "webhook_attempts"
    __table_args__ = {"sqlite_autoincrement": True}

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    delivery_id: Mapped[int] = mapped_column(
        ForeignKey("webhook_deliveries.id"), index=True
    )
    number: Mapped[int] = mapped_column(Integer)  # 1-based
    started_at: Mapped[float] = mapped_column(Float)
    duration_s: Mapped[float] = mapped_column(Float)
    status_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)


class EvalRecord(Base):
    """A job's eval (``client.evals``): one per job with a validation file; its
    testing criteria are the job's graders (a multi grader's sub-graders)."""

    __tablename__ = "evals"
    __table_args__ = (
        Index("ix_evals_tenant_seq", "tenant_id", "seq"),
        {"sqlite_autoincrement": True},
    )

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(40), unique=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"))
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), unique=True)
    name: Mapped[str] = mapped_column(String(255))
    testing_criteria: Mapped[list[dict[str, Any]]] = mapped_column(Json)
    created_at: Mapped[float] = mapped_column(Float)


class EvalRun(Base):
    """One validation of a job: the eval of one committed step."""

    __tablename__ = "eval_runs"
    __table_args__ = (
        Index("ix_eval_runs_eval_id_seq", "eval_id", "seq"),
        {"sqlite_autoincrement": True},
    )

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(40), unique=True)
    eval_id: Mapped[str] = mapped_column(ForeignKey("evals.id"))
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"))
    step: Mapped[int] = mapped_column(Integer)
    model: Mapped[str] = mapped_column(String(255))
    status: Mapped[str] = mapped_column(String(16))  # completed | failed
    # reward_mean, result_counts, per_testing_criteria_results, per-grader
    # means, error: the run as the API returns it, fixed once written.
    result: Mapped[dict[str, Any]] = mapped_column(Json)
    created_at: Mapped[float] = mapped_column(Float)


class EvalOutputItem(Base):
    """One validation row of a run: prompt, output, each grader's score."""

    __tablename__ = "eval_output_items"
    __table_args__ = (
        Index("ix_eval_output_items_run_id_seq", "run_id", "seq"),
        {"sqlite_autoincrement": True},
    )

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(40), unique=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("eval_runs.id"))
    eval_id: Mapped[str] = mapped_column(ForeignKey("evals.id"))
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"))
    datasource_item_id: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16))  # pass | fail | error
    # datasource_item, results, sample: as the API returns them.
    body: Mapped[dict[str, Any]] = mapped_column(Json)
    created_at: Mapped[float] = mapped_column(Float)
