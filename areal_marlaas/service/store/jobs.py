"""The API's side of jobs: creates, reads and cancel/pause/resume requests, every
one scoped to the calling tenant."""

from __future__ import annotations

import shutil
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from areal_marlaas.service.store.base import (
    Conflict,
    InvalidAction,
    LimitExceeded,
    NotFound,
    Page,
    StoreBase,
    logger,
)
from areal_marlaas.service.tables import (
    CANCELLED,
    FAILED,
    PAUSED,
    QUEUED,
    SUCCEEDED,
    TERMINAL,
    VALIDATING,
    Checkpoint,
    Event,
    File,
    Job,
    JobAction,
    new_id,
)

# Statuses that count against a tenant's max_queued_jobs.
WAITING = (VALIDATING, QUEUED, PAUSED)


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


def task_name_of(job_id: str) -> str:
    """The trainer's name for a job: ``ftjob-<hex>`` -> ``job_<hex>`` (fits
    TaskSpec.name: lowercase, digits, '_', <= 48 chars)."""
    return "job_" + job_id.split("-", 1)[1].lower()


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


class ApiJobStore(StoreBase):
    """Jobs as the API sees them: it inserts jobs and requests, never progress."""

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
                    assert waiting is not None  # count(*) returns a row
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
        # The query keeps only jobs with a fine_tuned_model.
        return [(n, t) for n, t in jobs if n is not None] + [(n, t) for n, t in ckpts]

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

    # -- continued fine-tuning: the adapter a job starts from --------------------
    def start_adapter(self, job_id: str) -> Path | None:
        """The adapter job ``job_id`` starts from (its copy), None: a fresh one."""
        path = self.root / START_ADAPTERS / job_id
        return path if path.is_dir() else None

    def keep_start_adapter(self, job_id: str, ckpt: Checkpoint) -> Path:
        """Copy checkpoint ``ckpt``'s adapter (PEFT files only, not its
        optimizer state) as the one job ``job_id`` starts from."""
        dst = self.root / START_ADAPTERS / job_id
        if dst.is_dir():  # an idempotent retry of the create
            return dst
        src = self.root / ckpt.adapter_path
        tmp = dst.with_name(f".{job_id}.partial")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            for name in ADAPTER_FILES:
                shutil.copyfile(src / name, tmp / name)
        except FileNotFoundError as e:
            shutil.rmtree(tmp, ignore_errors=True)
            raise NotFound(
                "model", ckpt.fine_tuned_model_checkpoint, param="model"
            ) from e
        tmp.rename(dst)
        return dst


START_ADAPTERS = "starts"
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


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


def _event_number(event_id: str) -> int:
    head, _, num = event_id.partition("-")
    if head != "ftevent" or not num.isdigit():
        raise NotFound("event", event_id, param="after")
    return int(num)
