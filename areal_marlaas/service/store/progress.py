"""The scheduler's side of jobs: status transitions, steps, checkpoints, events,
result files and handled requests, plus the reads of any tenant's jobs that the
scheduler, the metrics and the operator's status make."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from areal_marlaas.service import step_metrics
from areal_marlaas.service.store.base import InvalidTransition, NotFound
from areal_marlaas.service.store.files import FileStore
from areal_marlaas.service.store.webhooks import enqueue_job_event
from areal_marlaas.service.tables import (
    CANCELLED,
    FAILED,
    PAUSED,
    QUEUED,
    RUNNING,
    SUCCEEDED,
    TERMINAL,
    VALIDATING,
    Checkpoint,
    Event,
    File,
    Job,
    JobAction,
    Tenant,
    new_id,
)

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


def fine_tuned_model_name(base_model: str, tenant_name: str, job: Job) -> str:
    """OpenAI's shape, ``ft:<base>:<org>[:<suffix>]:<job>``; the job part makes it
    unique across the service. A job continuing a fine-tuned model names the
    base model that one was made from."""
    if base_model.startswith("ft:"):
        base_model = base_model.split(":")[1]
    parts = ["ft", base_model, tenant_name]
    if job.suffix:
        parts.append(job.suffix)
    parts.append(job.id.split("-", 1)[1])
    return ":".join(parts)


def checkpoint_name(fine_tuned_model: str, step: int) -> str:
    return f"{fine_tuned_model}:ckpt-step-{step}"


@dataclass(frozen=True)
class StepUsage:
    """What one committed step used: trainer-seconds, tokens generated for it."""

    trainer_s: float
    generated_tokens: int
    trained_tokens: int


class ProgressStore(FileStore):
    """What the scheduler writes (a :class:`FileStore` too: a job's result files
    are files of its tenant)."""

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
            # The webhook outbox, in this transaction: an event is never lost or
            # sent for a status that did not commit. Once: TERMINAL is final.
            enqueue_job_event(s, job, status, now)
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
        event: bool = True,
        usage: StepUsage | None = None,
    ) -> Job:
        """A committed training step (1-based): progress, TTFS on the first one
        (``first step - created_at``, the paper's metric) and a ``metrics`` event
        whose data is ``metrics`` (``step_metrics.step_data``'s shape) with the
        step and total (``event=False``: the caller writes it later, e.g. after
        the step's validation). ``trained_tokens`` sets the job's total;
        ``usage``, the step's own trainer-seconds and tokens, is added to the
        job's usage in the same transaction (restart-safe running totals)."""
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
            if usage is not None:
                job.trainer_s = (job.trainer_s or 0.0) + usage.trainer_s
                job.generated_tokens = (
                    job.generated_tokens or 0
                ) + usage.generated_tokens
                job.trained_tokens = (job.trained_tokens or 0) + usage.trained_tokens
            data = {"step": step, "total_steps": job.steps_total, **(metrics or {})}
            if not event:
                return job
            s.add(
                Event(
                    job_id=job_id,
                    created_at=at,
                    level="info",
                    message=step_metrics.message(data),
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

    def update_checkpoint_metrics(
        self, job_id: str, step_number: int, metrics: dict[str, Any]
    ) -> None:
        """A checkpoint's metrics once its step's validation is known."""
        with self._write() as s:
            ckpt = s.scalar(
                select(Checkpoint).where(
                    Checkpoint.job_id == job_id, Checkpoint.step_number == step_number
                )
            )
            if ckpt is not None:
                ckpt.metrics = _json_safe({"step": step_number, **metrics})

    def prune_checkpoints(
        self,
        job_id: str,
        keep_best: int,
        by: str,
        protect: frozenset[int] = frozenset(),
        higher_is_better: bool = True,
    ) -> list[tuple[int, str]]:
        """Keep a job's newest checkpoint and its ``keep_best`` best by
        ``metrics[by]`` (the highest, or the lowest for a loss:
        ``higher_is_better=False``; a missing score ranks last; a tie goes to
        the newer);
        delete the other rows and return their ``(step, adapter_path)`` for the
        caller to delete their files. ``keep_best`` 0 keeps every checkpoint;
        steps in ``protect`` (validation still running) are kept too."""
        if keep_best <= 0:
            return []
        with self._write() as s:
            ckpts = list(
                s.scalars(
                    select(Checkpoint)
                    .where(Checkpoint.job_id == job_id)
                    .order_by(Checkpoint.step_number)
                )
            )
            if len(ckpts) <= keep_best:
                return []

            def rank(c: Checkpoint) -> tuple[bool, float, int]:
                v = (c.metrics or {}).get(by)
                if isinstance(v, int | float) and math.isfinite(v):
                    return (True, v if higher_is_better else -v, c.step_number)
                return (False, 0.0, c.step_number)

            best = sorted(ckpts, key=rank, reverse=True)[:keep_best]
            keep = {ckpts[-1].id, *(c.id for c in best)}
            keep |= {c.id for c in ckpts if c.step_number in protect}
            dropped = [c for c in ckpts if c.id not in keep]
            now = time.time()
            for c in dropped:
                s.delete(c)
                s.add(
                    Event(
                        job_id=job_id,
                        created_at=now,
                        level="info",
                        message=f"Checkpoint at step {c.step_number} deleted: "
                        f"the job keeps its newest and its best {keep_best} by {by}",
                        type="message",
                        data={"checkpoint": c.id, "step": c.step_number},
                    )
                )
            return [(c.step_number, c.adapter_path) for c in dropped]

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

    # -- reads of any tenant's jobs ------------------------------------------------
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

    def metrics_steps(self, job_id: str) -> set[int]:
        """Steps the job has a ``metrics`` event for (restart reconciliation)."""
        with self._read() as s:
            metrics = Event.job_id == job_id, Event.type == "metrics"
            datas = s.scalars(select(Event.data).where(*metrics))
            return {int(d["step"]) for d in datas if d and "step" in d}

    def usage_by_tenant(self) -> dict[str, dict[str, float]]:
        """Tenant name -> its jobs' summed usage (every tenant, zeros too)."""
        cols = (
            func.coalesce(func.sum(Job.trainer_s), 0.0),
            func.coalesce(func.sum(Job.generated_tokens), 0),
            func.coalesce(func.sum(Job.trained_tokens), 0),
            func.coalesce(func.sum(Job.eval_tokens), 0),
            func.count(Job.id),
        )
        with self._read() as s:
            rows = s.execute(
                select(Tenant.name, *cols)
                .outerjoin(Job, Job.tenant_id == Tenant.id)
                .group_by(Tenant.name)
                .order_by(Tenant.name)
            ).all()
        return {
            name: {
                "trainer_s": float(tr),
                "generated_tokens": int(gen),
                "trained_tokens": int(trained or 0),
                "eval_tokens": int(ev),
                "jobs": int(n),
            }
            for name, tr, gen, trained, ev, n in rows
        }

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


def _check_transition(old: str, new: str) -> None:
    if new not in TRANSITIONS:
        raise InvalidTransition(f"unknown job status {new!r}")
    if new not in TRANSITIONS.get(old, frozenset()):
        raise InvalidTransition(f"a job cannot go from {old} to {new}")


def _json_safe(v: Any) -> Any:
    """NaN/inf are not JSON: store them as null."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {str(k): _json_safe(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_json_safe(x) for x in v]
    return v
