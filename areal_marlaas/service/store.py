"""The job store: the one place that reads and writes the service's tables.

Two sides use it:

* the API (many threads): tenants and keys, files, job creation, cancel/pause/resume
  *requests* (``job_actions`` rows) and reads. It never changes a job's progress.
* the scheduler (one writer process): claims jobs, moves them through their
  statuses, records steps, checkpoints, events and errors, and marks the requests it
  applied as handled.

Every call is one short transaction; SQLite write transactions take the write lock
up front (``BEGIN IMMEDIATE``), PostgreSQL ones lock the tenant row where a limit
is checked. Methods that take a ``tenant_id`` only ever see that tenant's rows: an
object of another tenant is :class:`NotFound`, exactly like a missing one.
Returned ORM objects are detached snapshots (reading them issues no SQL).
"""

from __future__ import annotations

import hashlib
import hmac
import math
import os
import re
import secrets
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from areal.utils import logging
from sqlalchemy import Select, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from areal_marlaas.service.db import WRITE, make_engine, upgrade_to_head
from areal_marlaas.service.models import (
    CANCELLED,
    FAILED,
    PAUSED,
    QUEUED,
    RUNNING,
    SUCCEEDED,
    TERMINAL,
    VALIDATING,
    ApiKey,
    Checkpoint,
    Event,
    File,
    Job,
    JobAction,
    Tenant,
    new_id,
)

logger = logging.getLogger("MARLaaSService")

T = TypeVar("T")

KEY_PREFIX = "sk-marlaas-"
TENANT_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
# Statuses that count against a tenant's max_queued_jobs.
WAITING = (VALIDATING, QUEUED, PAUSED)
# Status changes the scheduler may make (same status again is a no-op).
TRANSITIONS: dict[str, frozenset[str]] = {
    VALIDATING: frozenset({QUEUED, PAUSED, FAILED, CANCELLED}),
    QUEUED: frozenset({RUNNING, PAUSED, FAILED, CANCELLED}),
    RUNNING: frozenset({QUEUED, PAUSED, SUCCEEDED, FAILED, CANCELLED}),
    PAUSED: frozenset({VALIDATING, QUEUED, RUNNING, FAILED, CANCELLED}),
    SUCCEEDED: frozenset(),
    FAILED: frozenset(),
    CANCELLED: frozenset(),
}
_STATUS_MESSAGES = {
    QUEUED: "Files validated, moving job to queued state",
    RUNNING: "Fine-tuning job started",
    PAUSED: "Fine-tuning job paused",
    SUCCEEDED: "The job has successfully completed",
    FAILED: "The job failed",
    CANCELLED: "The job was cancelled",
}


class StoreError(Exception):
    """Base of the store's refusals; the API maps each to an HTTP error."""


class NotFound(StoreError):
    def __init__(self, kind: str, ident: str, param: str | None = None):
        super().__init__(f"No such {kind}: {ident}")
        self.kind, self.ident, self.param = kind, ident, param


class Conflict(StoreError):
    """The request contradicts the stored state (reused idempotency key, a file
    in use); retrying it unchanged cannot succeed."""

    def __init__(self, message: str, param: str | None = None, code: str = "conflict"):
        super().__init__(message)
        self.param, self.code = param, code


class LimitExceeded(StoreError):
    """A per-tenant quota (jobs, files) is full."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class InvalidAction(StoreError):
    """A cancel/pause/resume request that the job's state does not allow."""


class InvalidTransition(StoreError):
    """A scheduler-side status change the job's state does not allow."""


@dataclass
class Page(Generic[T]):
    items: list[T]
    has_more: bool


@dataclass
class NewJob:
    """A validated create request, "auto" hyperparameters already resolved."""

    model: str
    training_file: str
    validation_file: str | None
    method: dict[str, Any]
    hyperparameters: dict[str, Any]
    metadata: dict[str, str] | None
    seed: int
    suffix: str | None
    steps_total: int
    request_sha256: str = ""


@dataclass
class TenantInfo:
    id: str
    name: str
    created_at: float
    disabled: bool
    active_keys: list[str] = field(default_factory=list)  # display prefixes


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def new_api_key() -> str:
    """``sk-marlaas-`` + 256 random bits (url-safe base64)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def key_prefix(key: str) -> str:
    return key[: len(KEY_PREFIX) + 4] + "..."


def task_name_of(job_id: str) -> str:
    """The trainer's name for a job: ``ftjob-<hex>`` -> ``job_<hex>`` (fits
    TaskSpec.name: lowercase, digits, '_', <= 48 chars)."""
    return "job_" + job_id.split("-", 1)[1].lower()


def fine_tuned_model_name(base_model: str, tenant_name: str, job: Job) -> str:
    """OpenAI's shape, ``ft:<base>:<org>[:<suffix>]:<job>``; the job part makes it
    unique across the service."""
    parts = ["ft", base_model, tenant_name]
    if job.suffix:
        parts.append(job.suffix)
    parts.append(job.id.split("-", 1)[1])
    return ":".join(parts)


def checkpoint_name(fine_tuned_model: str, step: int) -> str:
    return f"{fine_tuned_model}:ckpt-step-{step}"


def effective_status(status: str, pending: list[str]) -> str:
    """The status a job will have once its unhandled requests are applied in order:
    what the API checks a new request against."""
    for action in pending:
        if status in TERMINAL:
            break
        if action == "cancel":
            status = CANCELLED
        elif action == "pause":
            status = PAUSED
        elif action == "resume" and status == PAUSED:
            status = QUEUED
    return status


class JobStore:
    """SQL job store at ``url``; file bodies and adapters live under ``root``."""

    def __init__(self, url: str, root: str | Path, *, migrate: bool = True):
        self.url = url
        self.root = Path(root).expanduser().absolute()
        self.root.mkdir(parents=True, exist_ok=True)
        self.engine = make_engine(url)
        if migrate:
            upgrade_to_head(self.engine)
        self._writer = self.engine.execution_options(**{WRITE: True})

    @classmethod
    def from_config(cls, cfg, *, migrate: bool = True) -> JobStore:
        """From a ``ServiceConfig`` (its root and DB URL)."""
        return cls(cfg.database_url, cfg.root_dir, migrate=migrate)

    def close(self) -> None:
        self.engine.dispose()

    @contextmanager
    def _read(self) -> Iterator[Session]:
        with Session(self.engine, expire_on_commit=False) as s, s.begin():
            yield s

    @contextmanager
    def _write(self) -> Iterator[Session]:
        with Session(self._writer, expire_on_commit=False) as s, s.begin():
            yield s

    # -- tenants and keys ----------------------------------------------------------
    def create_tenant(self, name: str) -> tuple[Tenant, str]:
        """A new tenant and its first API key (returned once, stored hashed)."""
        if not TENANT_NAME.match(name or ""):
            raise ValueError(
                f"tenant name {name!r} must match {TENANT_NAME.pattern} (it appears "
                "in model names)."
            )
        now = time.time()
        tenant = Tenant(id=new_id("org"), name=name, created_at=now, disabled=False)
        key = new_api_key()
        try:
            with self._write() as s:
                s.add(tenant)
                s.flush()
                s.add(self._key_row(tenant.id, key, now))
        except IntegrityError as e:
            raise Conflict(f"tenant {name!r} already exists", param="name") from e
        logger.info(f"Tenant {name} ({tenant.id}) created")
        return tenant, key

    @staticmethod
    def _key_row(tenant_id: str, key: str, now: float) -> ApiKey:
        return ApiKey(
            tenant_id=tenant_id,
            key_hash=hash_key(key),
            prefix=key_prefix(key),
            created_at=now,
        )

    def issue_key(self, tenant_name: str) -> str:
        """Another key for an existing tenant (rotation)."""
        key = new_api_key()
        with self._write() as s:
            tenant = self._tenant_by_name(s, tenant_name)
            tenant.disabled = False
            s.add(self._key_row(tenant.id, key, time.time()))
        return key

    @staticmethod
    def _tenant_by_name(s: Session, name: str) -> Tenant:
        tenant = s.scalar(select(Tenant).where(Tenant.name == name))
        if tenant is None:
            raise NotFound("tenant", name)
        return tenant

    def list_tenants(self) -> list[TenantInfo]:
        with self._read() as s:
            out = {
                t.id: TenantInfo(t.id, t.name, t.created_at, t.disabled)
                for t in s.scalars(select(Tenant).order_by(Tenant.created_at))
            }
            keys = select(ApiKey).where(ApiKey.revoked_at.is_(None))
            for k in s.scalars(keys.order_by(ApiKey.id)):
                out[k.tenant_id].active_keys.append(k.prefix)
        return list(out.values())

    def revoke(self, tenant_name: str, prefix: str | None = None) -> int:
        """Revoke a tenant's keys (all, or those whose display prefix starts with
        ``prefix``); without a prefix the tenant is also disabled. Returns the
        number of keys revoked."""
        now = time.time()
        with self._write() as s:
            tenant = self._tenant_by_name(s, tenant_name)
            keys = s.scalars(
                select(ApiKey).where(
                    ApiKey.tenant_id == tenant.id, ApiKey.revoked_at.is_(None)
                )
            ).all()
            hit = [k for k in keys if prefix is None or k.prefix.startswith(prefix)]
            for k in hit:
                k.revoked_at = now
            if prefix is None:
                tenant.disabled = True
        return len(hit)

    def authenticate(self, key: str) -> Tenant | None:
        """The tenant owning an active ``key``, else None."""
        digest = hash_key(key)
        with self._read() as s:
            row = s.execute(
                select(ApiKey, Tenant)
                .join(Tenant, Tenant.id == ApiKey.tenant_id)
                .where(ApiKey.key_hash == digest)
            ).first()
        if row is None:
            return None
        api_key, tenant = row
        # The lookup already matched; compare again in constant time so the
        # decision never rests on a short-circuiting comparison.
        if not hmac.compare_digest(api_key.key_hash, digest):
            return None
        if api_key.revoked_at is not None or tenant.disabled:
            return None
        return tenant

    def tenant(self, tenant_id: str) -> Tenant:
        with self._read() as s:
            tenant = s.get(Tenant, tenant_id)
        if tenant is None:
            raise NotFound("tenant", tenant_id)
        return tenant

    # -- files ---------------------------------------------------------------------
    def file_path(self, f: File) -> Path:
        return self.root / f.path

    def add_file(
        self,
        tenant_id: str,
        filename: str,
        purpose: str,
        body: bytes,
        lines: int,
        *,
        max_files: int | None = None,
    ) -> File:
        """Store a validated upload: the body under ``files/<tenant>/<id>.jsonl``
        (never a path built from the uploaded name), then its row."""
        file_id = new_id("file")
        # Uploads are JSONL; results (archives, CSVs) keep no misleading suffix.
        suffix = ".jsonl" if purpose == "fine-tune" else ""
        rel = Path("files") / tenant_id / f"{file_id}{suffix}"
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".partial")
        tmp.write_bytes(body)
        os.replace(tmp, path)
        row = File(
            id=file_id,
            tenant_id=tenant_id,
            filename=filename,
            purpose=purpose,
            bytes=len(body),
            sha256=hashlib.sha256(body).hexdigest(),
            lines=lines,
            created_at=time.time(),
            path=str(rel),
        )
        try:
            with self._write() as s:
                self._lock_tenant(s, tenant_id)
                if max_files is not None:
                    stored = s.scalar(
                        select(func.count())
                        .select_from(File)
                        .where(File.tenant_id == tenant_id, File.deleted_at.is_(None))
                    )
                    if stored >= max_files:
                        raise LimitExceeded(
                            f"You have {stored} stored files, the limit is "
                            f"{max_files} (max_files); delete some first.",
                            param="file",
                        )
                s.add(row)
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        return row

    @staticmethod
    def _lock_tenant(s: Session, tenant_id: str) -> None:
        # Serializes a tenant's limit check + insert on PostgreSQL; on SQLite the
        # IMMEDIATE transaction already does (FOR UPDATE is not rendered there).
        s.execute(select(Tenant.id).where(Tenant.id == tenant_id).with_for_update())

    def get_file(
        self, tenant_id: str, file_id: str, *, param: str | None = None
    ) -> File:
        with self._read() as s:
            f = s.scalar(
                select(File).where(
                    File.id == file_id,
                    File.tenant_id == tenant_id,
                    File.deleted_at.is_(None),
                )
            )
        if f is None:
            raise NotFound("file", file_id, param)
        return f

    def list_files(
        self,
        tenant_id: str,
        *,
        after: str | None = None,
        limit: int = 10000,
        order: str = "desc",
        purpose: str | None = None,
    ) -> Page[File]:
        with self._read() as s:
            q = select(File).where(File.tenant_id == tenant_id)
            if after is not None:
                seq = self._cursor_seq(s, File, tenant_id, after, "file")
                q = q.where(File.seq < seq if order == "desc" else File.seq > seq)
            q = q.where(File.deleted_at.is_(None))
            if purpose:
                q = q.where(File.purpose == purpose)
            q = q.order_by(File.seq.desc() if order == "desc" else File.seq.asc())
            return self._page(s, q, limit)

    @staticmethod
    def _cursor_seq(s: Session, model, tenant_id: str, after: str, kind: str) -> int:
        # A cursor is looked up in the tenant's own rows only (deleted ones too, so
        # paging survives a delete); anything else is "no such" for the `after` param.
        seq = s.scalar(
            select(model.seq).where(model.id == after, model.tenant_id == tenant_id)
        )
        if seq is None:
            raise NotFound(kind, after, param="after")
        return seq

    @staticmethod
    def _page(s: Session, q: Select, limit: int) -> Page:
        rows = list(s.scalars(q.limit(limit + 1)))
        return Page(rows[:limit], len(rows) > limit)

    def delete_file(self, tenant_id: str, file_id: str) -> File:
        """Soft-delete (the row stays for cursors and jobs); the body goes. A file
        that an unfinished job trains on cannot be deleted."""
        with self._write() as s:
            f = s.scalar(
                select(File).where(
                    File.id == file_id,
                    File.tenant_id == tenant_id,
                    File.deleted_at.is_(None),
                )
            )
            if f is None:
                raise NotFound("file", file_id)
            user = s.scalar(
                select(Job.id).where(
                    Job.tenant_id == tenant_id,
                    Job.status.not_in(TERMINAL),
                    (Job.training_file == file_id) | (Job.validation_file == file_id),
                )
            )
            if user is not None:
                raise Conflict(
                    f"File {file_id} is used by job {user}, which has not finished; "
                    "cancel the job or wait for it to end.",
                    param="file_id",
                    code="file_in_use",
                )
            f.deleted_at = time.time()
        self.file_path(f).unlink(missing_ok=True)
        return f

    # -- jobs: the API side ----------------------------------------------------------
    def create_job(
        self,
        tenant_id: str,
        new: NewJob,
        *,
        idempotency_key: str | None = None,
        max_queued: int | None = None,
    ) -> tuple[Job, bool]:
        """Insert a job in ``validating_files``. Returns ``(job, created)``: with an
        ``idempotency_key`` this tenant already used, the earlier job and False (a
        different body under the same key is a :class:`Conflict`)."""
        if idempotency_key is not None:
            earlier = self._by_idempotency_key(tenant_id, idempotency_key, new)
            if earlier is not None:
                return earlier, False
        now = time.time()
        job_id = new_id("ftjob")
        job = Job(
            id=job_id,
            tenant_id=tenant_id,
            model=new.model,
            training_file=new.training_file,
            validation_file=new.validation_file,
            status=VALIDATING,
            method=new.method,
            hyperparameters=new.hyperparameters,
            metadata_=new.metadata,
            seed=new.seed,
            suffix=new.suffix,
            task_name=task_name_of(job_id),
            created_at=now,
            steps_total=new.steps_total,
            steps_done=0,
            result_files=[],
            idempotency_key=idempotency_key,
            request_sha256=new.request_sha256,
        )
        try:
            with self._write() as s:
                self._lock_tenant(s, tenant_id)
                for param, fid in (
                    ("training_file", new.training_file),
                    ("validation_file", new.validation_file),
                ):
                    if fid is None:
                        continue
                    ok = s.scalar(
                        select(File.id).where(
                            File.id == fid,
                            File.tenant_id == tenant_id,
                            File.purpose == "fine-tune",
                            File.deleted_at.is_(None),
                        )
                    )
                    if ok is None:
                        raise NotFound("file", fid, param=param)
                if max_queued is not None:
                    waiting = s.scalar(
                        select(func.count())
                        .select_from(Job)
                        .where(Job.tenant_id == tenant_id, Job.status.in_(WAITING))
                    )
                    if waiting >= max_queued:
                        raise LimitExceeded(
                            f"You have {waiting} jobs waiting to run (validating, "
                            f"queued or paused); the limit is {max_queued} "
                            "(max_queued_jobs). Wait for one to start or cancel one."
                        )
                s.add(job)
                s.flush()
                s.add(
                    Event(
                        job_id=job_id,
                        created_at=now,
                        level="info",
                        message=f"Created fine-tuning job: {job_id}",
                        type="message",
                        data={},
                    )
                )
        except IntegrityError:
            # Two creates with one key raced; the loser returns the winner's job.
            if idempotency_key is not None:
                earlier = self._by_idempotency_key(tenant_id, idempotency_key, new)
                if earlier is not None:
                    return earlier, False
            raise
        logger.info(f"Job {job_id} created for tenant {tenant_id}")
        return job, True

    def _by_idempotency_key(self, tenant_id: str, key: str, new: NewJob) -> Job | None:
        with self._read() as s:
            job = s.scalar(
                select(Job).where(
                    Job.tenant_id == tenant_id, Job.idempotency_key == key
                )
            )
        if job is not None and job.request_sha256 != new.request_sha256:
            raise Conflict(
                f"Idempotency-Key {key!r} was already used for job {job.id} with a "
                "different request body; use a new key for a new job.",
                param="Idempotency-Key",
                code="idempotency_key_reused",
            )
        return job

    def recent_duplicate(
        self, tenant_id: str, request_sha256: str, since: float
    ) -> Job | None:
        """The tenant's newest job created from the same request body since
        ``since``: what an SDK retry of a create whose reply was lost should get."""
        with self._read() as s:
            return s.scalar(
                select(Job)
                .where(
                    Job.tenant_id == tenant_id,
                    Job.request_sha256 == request_sha256,
                    Job.created_at >= since,
                )
                .order_by(Job.seq.desc())
                .limit(1)
            )

    def get_job(self, tenant_id: str, job_id: str) -> Job:
        with self._read() as s:
            job = s.scalar(
                select(Job).where(Job.id == job_id, Job.tenant_id == tenant_id)
            )
        if job is None:
            raise NotFound("job", job_id)
        return job

    def list_jobs(
        self,
        tenant_id: str,
        *,
        after: str | None = None,
        limit: int = 20,
        metadata: dict[str, str] | None = None,
        metadata_null: bool = False,
    ) -> Page[Job]:
        """Newest first. ``metadata`` keeps jobs whose metadata has every given
        pair; ``metadata_null`` keeps jobs created without metadata."""
        with self._read() as s:
            q = select(Job).where(Job.tenant_id == tenant_id)
            if after is not None:
                q = q.where(Job.seq < self._cursor_seq(s, Job, tenant_id, after, "job"))
            if metadata_null:
                q = q.where(Job.metadata_.is_(None))
            q = q.order_by(Job.seq.desc())
            if not metadata:
                return self._page(s, q, limit)
            # Matched here, not in SQL: JSON path syntax differs per database and
            # keys may hold any character; a tenant's job list is small.
            hits: list[Job] = []
            for job in s.scalars(q.execution_options(yield_per=200)):
                md = job.metadata_ or {}
                if all(md.get(k) == v for k, v in metadata.items()):
                    hits.append(job)
                    if len(hits) > limit:
                        break
            return Page(hits[:limit], len(hits) > limit)

    def pending_actions_of(self, job_ids: list[str]) -> dict[str, list[str]]:
        """Unhandled requests per job, oldest first."""
        if not job_ids:
            return {}
        out: dict[str, list[str]] = defaultdict(list)
        with self._read() as s:
            rows = s.execute(
                select(JobAction.job_id, JobAction.action)
                .where(JobAction.job_id.in_(job_ids), JobAction.handled_at.is_(None))
                .order_by(JobAction.id)
            )
            for job_id, action in rows:
                out[job_id].append(action)
        return dict(out)

    def request_action(self, tenant_id: str, job_id: str, action: str) -> Job:
        """Queue a cancel/pause/resume for the scheduler, if the job's state (with
        the requests already queued) allows it. A cancel of a job already being
        cancelled is a no-op."""
        if action not in ("cancel", "pause", "resume"):
            raise ValueError(f"unknown action {action!r}")
        with self._write() as s:
            self._lock_tenant(s, tenant_id)  # one check-then-insert at a time
            job = s.scalar(
                select(Job).where(Job.id == job_id, Job.tenant_id == tenant_id)
            )
            if job is None:
                raise NotFound("job", job_id)
            pending = list(
                s.scalars(
                    select(JobAction.action)
                    .where(JobAction.job_id == job_id, JobAction.handled_at.is_(None))
                    .order_by(JobAction.id)
                )
            )
            state = effective_status(job.status, pending)
            _check_action(job, state, action)
            if action == "cancel" and state == CANCELLED:
                return job  # already being cancelled
            s.add(JobAction(job_id=job_id, action=action, created_at=time.time()))
        logger.info(f"Job {job_id}: {action} requested")
        return job

    def list_events(
        self, tenant_id: str, job_id: str, *, after: str | None = None, limit: int = 20
    ) -> Page[Event]:
        """Newest first; ``after`` is an event id (``ftevent-<n>``)."""
        self.get_job(tenant_id, job_id)
        with self._read() as s:
            q = select(Event).where(Event.job_id == job_id)
            if after is not None:
                n = _event_number(after)
                owner = s.scalar(select(Event.job_id).where(Event.id == n))
                if owner != job_id:
                    raise NotFound("event", after, param="after")
                q = q.where(Event.id < n)
            return self._page(s, q.order_by(Event.id.desc()), limit)

    def list_checkpoints(
        self, tenant_id: str, job_id: str, *, after: str | None = None, limit: int = 10
    ) -> Page[Checkpoint]:
        """Newest first."""
        self.get_job(tenant_id, job_id)
        with self._read() as s:
            q = select(Checkpoint).where(
                Checkpoint.job_id == job_id, Checkpoint.tenant_id == tenant_id
            )
            if after is not None:
                seq = self._cursor_seq(s, Checkpoint, tenant_id, after, "checkpoint")
                q = q.where(Checkpoint.seq < seq)
            return self._page(s, q.order_by(Checkpoint.seq.desc()), limit)

    def models_of(self, tenant_id: str) -> list[tuple[str, float]]:
        """The tenant's servable names with their creation times: each job's
        ``fine_tuned_model`` and each checkpoint's name."""
        with self._read() as s:
            jobs = s.execute(
                select(Job.fine_tuned_model, Job.created_at)
                .where(Job.tenant_id == tenant_id, Job.fine_tuned_model.is_not(None))
                .order_by(Job.seq)
            ).all()
            ckpts = s.execute(
                select(Checkpoint.fine_tuned_model_checkpoint, Checkpoint.created_at)
                .where(Checkpoint.tenant_id == tenant_id)
                .order_by(Checkpoint.seq)
            ).all()
        return [(n, t) for n, t in jobs] + [(n, t) for n, t in ckpts]

    def checkpoint_for_model(self, tenant_id: str, model: str) -> Checkpoint | None:
        """What a tenant's ``model=`` names: a checkpoint by its own name, or a
        job's ``fine_tuned_model`` (its newest checkpoint). None otherwise."""
        with self._read() as s:
            ckpt = s.scalar(
                select(Checkpoint).where(
                    Checkpoint.tenant_id == tenant_id,
                    Checkpoint.fine_tuned_model_checkpoint == model,
                )
            )
            if ckpt is not None:
                return ckpt
            job_id = s.scalar(
                select(Job.id).where(
                    Job.tenant_id == tenant_id, Job.fine_tuned_model == model
                )
            )
            if job_id is None:
                return None
            return s.scalar(
                select(Checkpoint)
                .where(Checkpoint.job_id == job_id)
                .order_by(Checkpoint.step_number.desc(), Checkpoint.seq.desc())
                .limit(1)
            )

    # -- jobs: the scheduler side (the one writer of progress) ----------------------
    @staticmethod
    def _pending(s: Session, job_ids: list[str]) -> dict[str, list[str]]:
        out: dict[str, list[str]] = defaultdict(list)
        rows = s.execute(
            select(JobAction.job_id, JobAction.action)
            .where(JobAction.job_id.in_(job_ids), JobAction.handled_at.is_(None))
            .order_by(JobAction.id)
        )
        for job_id, action in rows:
            out[job_id].append(action)
        return out

    def set_status(
        self,
        job_id: str,
        status: str,
        message: str | None = None,
        *,
        level: str = "info",
        error: dict[str, Any] | None = None,
    ) -> Job:
        """Move a job to ``status`` (see ``TRANSITIONS``) and log an event.
        Setting the current status again changes nothing."""
        with self._write() as s:
            job = self._job(s, job_id)
            if job.status == status:
                return job
            _check_transition(job.status, status)
            job.status = status
            self._on_status(s, job, status, message, level, error)
        return job

    def _on_status(
        self,
        s: Session,
        job: Job,
        status: str,
        message: str | None,
        level: str,
        error: dict[str, Any] | None,
    ) -> None:
        now = time.time()
        if status == RUNNING and job.started_at is None:
            job.started_at = now
        if status in TERMINAL:
            job.finished_at = now
            job.estimated_finish = None
        if status == FAILED:
            job.error = error or {
                "code": "internal_error",
                "message": message or "The job failed.",
                "param": None,
            }
            level = "error"
        s.add(
            Event(
                job_id=job.id,
                created_at=now,
                level=level,
                message=message or _STATUS_MESSAGES.get(status, f"Status: {status}"),
                type="message",
                data={"status": status},
            )
        )

    @staticmethod
    def _job(s: Session, job_id: str) -> Job:
        job = s.scalar(select(Job).where(Job.id == job_id))
        if job is None:
            raise NotFound("job", job_id)
        return job

    def fail_job(
        self, job_id: str, code: str, message: str, param: str | None = None
    ) -> Job:
        """Mark a job failed with OpenAI's error object ``{code, message, param}``
        (e.g. ``invalid_training_file`` from file validation)."""
        return self.set_status(
            job_id,
            FAILED,
            message,
            error={"code": code, "message": message, "param": param},
        )

    def set_plan(
        self,
        job_id: str,
        *,
        steps_total: int | None = None,
        estimated_finish: float | None = None,
        trained_tokens: int | None = None,
    ) -> Job:
        """Update the scheduler's plan for a job without logging an event."""
        with self._write() as s:
            job = self._job(s, job_id)
            if steps_total is not None:
                job.steps_total = steps_total
            if estimated_finish is not None:
                job.estimated_finish = estimated_finish
            if trained_tokens is not None:
                job.trained_tokens = trained_tokens
        return job

    def record_step(
        self,
        job_id: str,
        step: int,
        metrics: dict[str, Any] | None = None,
        *,
        trained_tokens: int | None = None,
        estimated_finish: float | None = None,
        at: float | None = None,
    ) -> Job:
        """A committed training step (1-based): progress, TTFS on the first one
        (``first step - created_at``, the paper's metric) and a ``metrics`` event.
        ``trained_tokens`` is the job's running total."""
        at = time.time() if at is None else at
        with self._write() as s:
            job = self._job(s, job_id)
            if job.status in TERMINAL:
                raise InvalidTransition(
                    f"job {job_id} is {job.status}; it records no more steps"
                )
            job.steps_done = max(job.steps_done, step)
            if job.first_step_at is None:
                job.first_step_at = at
                job.ttfs_s = at - job.created_at
            if trained_tokens is not None:
                job.trained_tokens = trained_tokens
            if estimated_finish is not None:
                job.estimated_finish = estimated_finish
            data = {
                "step": step,
                "total_steps": job.steps_total,
                "committed_at": at,  # to the ms: TPTS (created_at is whole s)
                **(metrics or {}),
            }
            s.add(
                Event(
                    job_id=job_id,
                    created_at=at,
                    level="info",
                    message=f"Step {step}/{job.steps_total}: "
                    + ", ".join(f"{k}={_fmt(v)}" for k, v in (metrics or {}).items()),
                    type="metrics",
                    data=_json_safe(data),
                )
            )
        return job

    def record_checkpoint(
        self,
        job_id: str,
        step_number: int,
        version: int,
        adapter_path: str | Path,
        metrics: dict[str, Any] | None = None,
    ) -> Checkpoint:
        """A servable adapter of a job (a PEFT folder under the service root). The
        job's ``fine_tuned_model`` is set on its first checkpoint and always names
        the newest one."""
        path = Path(adapter_path)
        path = path if path.is_absolute() else self.root / path
        try:
            rel = path.resolve().relative_to(self.root.resolve())
        except ValueError as e:
            raise ValueError(
                f"adapter {adapter_path} is not under the service root {self.root}"
            ) from e
        now = time.time()
        with self._write() as s:
            job = self._job(s, job_id)
            tenant = s.get(Tenant, job.tenant_id)
            assert tenant is not None
            if job.fine_tuned_model is None:
                job.fine_tuned_model = fine_tuned_model_name(
                    job.model, tenant.name, job
                )
            ckpt = Checkpoint(
                id=new_id("ftckpt"),
                job_id=job_id,
                tenant_id=job.tenant_id,
                step_number=step_number,
                version=version,
                fine_tuned_model_checkpoint=checkpoint_name(
                    job.fine_tuned_model, step_number
                ),
                adapter_path=str(rel),
                metrics=_json_safe({"step": step_number, **(metrics or {})}),
                created_at=now,
            )
            s.add(ckpt)
            s.add(
                Event(
                    job_id=job_id,
                    created_at=now,
                    level="info",
                    message=f"Checkpoint created at step {step_number}",
                    type="message",
                    data={"checkpoint": ckpt.id, "step": step_number},
                )
            )
        return ckpt

    def add_event(
        self,
        job_id: str,
        message: str,
        *,
        level: str = "info",
        type: str = "message",
        data: dict[str, Any] | None = None,
    ) -> Event:
        if level not in ("info", "warn", "error"):
            raise ValueError(f"event level {level!r}: info, warn or error")
        if type not in ("message", "metrics"):
            raise ValueError(f"event type {type!r}: message or metrics")
        with self._write() as s:
            self._job(s, job_id)
            ev = Event(
                job_id=job_id,
                created_at=time.time(),
                level=level,
                message=message,
                type=type,
                data=_json_safe(data or {}),
            )
            s.add(ev)
        return ev

    def pending_actions(self, limit: int = 100) -> list[JobAction]:
        """Unhandled cancel/pause/resume requests, oldest first."""
        with self._read() as s:
            return list(
                s.scalars(
                    select(JobAction)
                    .where(JobAction.handled_at.is_(None))
                    .order_by(JobAction.id)
                    .limit(limit)
                )
            )

    def mark_action_handled(self, action_id: int, outcome: str = "applied") -> None:
        with self._write() as s:
            action = s.get(JobAction, action_id)
            if action is None:
                raise NotFound("action", str(action_id))
            if action.handled_at is None:
                action.handled_at = time.time()
                action.outcome = outcome

    def add_result_file(
        self, job_id: str, filename: str, body: bytes, *, purpose="fine-tune-results"
    ) -> File:
        """A file the job produced (metrics, the final adapter archive), owned by the
        job's tenant and listed in the job's ``result_files``."""
        job = self._job_readonly(job_id)
        lines = body.count(b"\n") + (0 if body.endswith(b"\n") or not body else 1)
        f = self.add_file(job.tenant_id, filename, purpose, body, lines)
        with self._write() as s:
            job = self._job(s, job_id)
            job.result_files = [*job.result_files, f.id]
        return f

    def _job_readonly(self, job_id: str) -> Job:
        with self._read() as s:
            return self._job(s, job_id)

    def job(self, job_id: str) -> Job:
        """A job by id, any tenant (scheduler and operator use)."""
        return self._job_readonly(job_id)

    def jobs_with_status(self, *statuses: str) -> list[Job]:
        with self._read() as s:
            return list(
                s.scalars(select(Job).where(Job.status.in_(statuses)).order_by(Job.seq))
            )

    def file_of_job(self, job_id: str, which: str = "training_file") -> Path:
        """Where the body of a job's training/validation file is (scheduler)."""
        with self._read() as s:
            job = self._job(s, job_id)
            fid = getattr(job, which)
            f = s.scalar(select(File).where(File.id == fid)) if fid else None
        if f is None:
            raise NotFound("file", str(fid))
        return self.file_path(f)

    def checkpoint_steps(self, job_id: str) -> set[int]:
        """Step numbers the job has checkpoints for (restart reconciliation)."""
        with self._read() as s:
            return set(
                s.scalars(
                    select(Checkpoint.step_number).where(Checkpoint.job_id == job_id)
                )
            )

    def job_counts(self) -> dict[tuple[str, str], int]:
        """``(tenant_id, status) -> jobs``, for metrics."""
        with self._read() as s:
            rows = s.execute(
                select(Job.tenant_id, Job.status, func.count()).group_by(
                    Job.tenant_id, Job.status
                )
            ).all()
        return {(t, st): n for t, st, n in rows}

    def all_jobs(self) -> list[tuple[Job, str]]:
        """Every job with its tenant's name, oldest first (operator status)."""
        with self._read() as s:
            rows = s.execute(
                select(Job, Tenant.name)
                .join(Tenant, Tenant.id == Job.tenant_id)
                .order_by(Job.seq)
            ).all()
        return [(j, n) for j, n in rows]


def _check_action(job: Job, state: str, action: str) -> None:
    if job.status in TERMINAL:
        raise InvalidAction(
            f"Job {job.id} has already {_finished_verb(job.status)}; it cannot be "
            f"{_participle(action)}."
        )
    if action == "cancel":
        return
    if state == CANCELLED:
        raise InvalidAction(
            f"Job {job.id} is being cancelled; it cannot be {_participle(action)}."
        )
    if action == "pause" and state == PAUSED:
        raise InvalidAction(f"Job {job.id} is already paused.")
    if action == "resume" and state != PAUSED:
        raise InvalidAction(
            f"Job {job.id} is not paused (status: {state}); only a paused job can "
            "be resumed."
        )


def _finished_verb(status: str) -> str:
    return {SUCCEEDED: "succeeded", FAILED: "failed", CANCELLED: "been cancelled"}[
        status
    ]


def _participle(action: str) -> str:
    return {"cancel": "cancelled", "pause": "paused", "resume": "resumed"}[action]


def _check_transition(old: str, new: str) -> None:
    if new not in TRANSITIONS:
        raise InvalidTransition(f"unknown job status {new!r}")
    if new not in TRANSITIONS.get(old, frozenset()):
        raise InvalidTransition(f"a job cannot go from {old} to {new}")


def _event_number(event_id: str) -> int:
    head, _, num = event_id.partition("-")
    if head != "ftevent" or not num.isdigit():
        raise NotFound("event", event_id, param="after")
    return int(num)


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _json_safe(v: Any) -> Any:
    """NaN/inf are not JSON: store them as null."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {str(k): _json_safe(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_json_safe(x) for x in v]
    return v
