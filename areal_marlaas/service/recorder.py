"""What the service records for a job the runtime holds: each committed step
(progress, usage, ETA, checkpoint, its metrics event in OpenAI's shape), each
validation (an eval run, the step's validation scores), checkpoint retention,
and after a restart what the run store committed but the database missed. The
runner calls it from the runtime's callbacks; it writes only the job store and
deletes only pruned checkpoint folders."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from typing import Any, cast

from areal.utils import logging

from areal_marlaas.config.service import ServiceConfig
from areal_marlaas.rundir.reader import task_steps
from areal_marlaas.rundir.records import EvalRecord, EvalSample, StepRecord
from areal_marlaas.rundir.writer import RunStore
from areal_marlaas.scheduler.tasks import eval_due
from areal_marlaas.service import eval_runs, step_metrics
from areal_marlaas.service.prometheus import ServiceMetrics
from areal_marlaas.service.store import JobStore, StepUsage, checkpoint_name
from areal_marlaas.service.tables import PAUSED, QUEUED, RUNNING, Job

logger = logging.getLogger("MARLaaSServiceRunner")


def step_usage(r: StepRecord) -> StepUsage:
    """A step record's trainer-seconds and tokens. Its batch's generated tokens
    are the ones it trained on (the loss covers completions only); rollouts of
    batches that were dropped are not counted. A supervised or DPO step
    generated none."""
    tokens = int(r.get("trained_tokens") or 0)
    rolled_out = r.get("supervised") is None and r.get("preference") is None
    generated = tokens if rolled_out else 0
    return StepUsage(float(r.get("train_s") or 0.0), generated, tokens)


# Steps whose intervals give a job's estimated finish.
ETA_WINDOW = 5


@dataclass
class Admitted:
    """A job the runtime holds (running, waiting for admission, or paused)."""

    job_id: str
    tenant_id: str
    task: str
    total_steps: int
    started: bool = False  # rolled out at least once in this process
    waiting: bool = False  # a hold was reported
    first_step_seen: bool = False
    paused_by_tenant: bool = False
    # Validation (a job with a validation file): its eval, how often, and the
    # step records whose metrics event waits for their eval's scores.
    eval_id: str | None = None
    eval_every: int = 0
    start_version: int = 0
    pending: dict[int, StepRecord] = field(default_factory=dict)
    # Commit times of its newest steps in this process (the job's ETA).
    commits: list[float] = field(default_factory=list)
    eta: float | None = None  # its estimated finish (epoch seconds), once known
    weight: float = 1.0  # its tenant's, as the scheduler has it
    # The checkpoint metric its best checkpoints are kept by ("": its reward,
    # on validation when it has an eval), and whether higher is better.
    rank_by: str = ""
    higher_is_better: bool = True


class JobRecorder:
    """The job store's writes for held jobs (see the module's docstring)."""

    def __init__(
        self,
        jobs: JobStore,
        store: RunStore,
        svc: ServiceConfig,
        metrics: ServiceMetrics | None = None,
    ):
        self.jobs, self.store, self.svc = jobs, store, svc
        self.metrics = metrics or ServiceMetrics()

    def step(self, held: Admitted, r: StepRecord) -> None:
        """A committed step: progress, usage, ETA and the checkpoint; its
        metrics event now, or when its validation returns."""
        data = step_metrics.step_data(r, held.total_steps)
        version = r["version"]
        # An evaluated step's metrics event waits for its validation scores.
        due = held.eval_id is not None and eval_due(
            version, held.eval_every, held.total_steps, held.start_version
        )
        if due:
            held.pending[version] = r
        held.commits = [*held.commits[-ETA_WINDOW:], r["t_commit"]]
        held.eta = step_metrics.estimated_finish(
            held.commits, held.total_steps - version
        )
        self.jobs.record_step(
            held.job_id,
            version,
            data,
            estimated_finish=held.eta,
            at=r["t_commit"],
            event=not due,
            usage=step_usage(r),
        )
        self.jobs.record_checkpoint(
            held.job_id,
            version,
            version,
            self.store.adapter_dir(r["task"], version),
            step_metrics.checkpoint_metrics(data),
        )
        self.prune(held)
        self.metrics.observe_step(held.tenant_id, r["train_s"])
        self.metrics.observe_tools(
            held.tenant_id, dict(r.get("tools") or {}), r.get("discarded_groups", 0)
        )
        if not held.first_step_seen:
            held.first_step_seen = True
            job = self.jobs.job(held.job_id)
            if job.ttfs_s is not None:
                self.metrics.observe_ttfs(held.tenant_id, job.ttfs_s)
        for reason, n in (r.get("reward_reasons") or {}).items():
            self.jobs.add_event(
                held.job_id,
                f"step {version}: {n} sample(s) scored 0: {reason}",
                level="warn",
            )

    def prune(self, held: Admitted) -> None:
        """Drop the checkpoints beyond the newest and the best ones (those whose
        validation runs stay), rows first: a crash between the two leaves only
        files that nothing names."""
        job_id = held.job_id
        by = held.rank_by or (
            "valid_reward_mean" if held.eval_id else "train_reward_mean"
        )
        for step, path in self.jobs.prune_checkpoints(
            job_id,
            self.svc.keep_checkpoints,
            by,
            frozenset(held.pending),
            higher_is_better=held.higher_is_better,
        ):
            shutil.rmtree(self.jobs.root / path, ignore_errors=True)
            logger.info(f"job {job_id}: deleted checkpoint step {step} ({path})")

    def eval(self, held: Admitted, r: EvalRecord, samples: list[EvalSample]) -> None:
        """A step's validation: an eval run with its samples, then the step's
        metrics event with its validation scores, the checkpoint's metrics and
        the retention that ranks by them."""
        if held.eval_id is None:
            return
        version = r["version"]
        job = self.jobs.job(held.job_id)
        model = (
            checkpoint_name(job.fine_tuned_model, version)
            if job.fine_tuned_model
            else job.model
        )
        self.jobs.record_eval_run(
            held.eval_id,
            version,
            model,
            "failed" if r["reward_mean"] is None else "completed",
            eval_runs.run_result(r, samples),
            eval_runs.output_items(
                samples, model, self.svc.temperature, self.svc.max_new_tokens
            ),
            eval_tokens=r.get("generated_tokens", 0),
        )
        record = held.pending.pop(version, None)
        if record is not None:
            valid = None
            if r["reward_mean"] is not None:
                valid = {"reward_mean": r["reward_mean"], "graders": r["graders"]}
            self._metrics_event(held, record, valid, r["end"] - r["start"])
        self.prune(held)

    def _metrics_event(
        self,
        held: Admitted,
        r: StepRecord,
        valid: dict[str, Any] | None = None,
        eval_s: float | None = None,
    ) -> None:
        data = step_metrics.step_data(r, held.total_steps, valid, eval_s)
        self.jobs.add_event(
            held.job_id, step_metrics.message(data), type="metrics", data=data
        )
        self.jobs.update_checkpoint_metrics(
            held.job_id, r["version"], step_metrics.checkpoint_metrics(data)
        )

    def flush(self, held: Admitted) -> None:
        """A job ending with evals that never ran: their steps' events without
        validation scores."""
        for version in sorted(held.pending):
            self._metrics_event(held, held.pending.pop(version))

    # -- restart ----------------------------------------------------------------
    def reconcile(self) -> None:
        """After a restart: every version the run store committed has its
        checkpoint in the database (a crash can fall between the two)."""
        for job in self.jobs.jobs_with_status(RUNNING, QUEUED, PAUSED):
            state = self.store.committed(job.task_name)
            if state is None:
                continue
            # Only versions past the newest recorded one: older ones missing
            # from the database were pruned on purpose.
            have = self.jobs.checkpoint_steps(job.id)
            newest = max(have, default=0)
            steps = {
                s["version"]: s for s in task_steps(self.store.root, job.task_name)
            }
            for version in range(1, state["version"] + 1):
                folder = self.store.adapter_dir(job.task_name, version)
                if version <= newest or not folder.is_dir():
                    continue
                row = steps.get(version)
                data = (
                    step_metrics.step_data(cast(StepRecord, row), job.steps_total)
                    if row is not None
                    else {"step": version, "total_steps": job.steps_total}
                )
                if job.status != PAUSED:
                    usage = step_usage(cast(StepRecord, row)) if row else None
                    self.jobs.record_step(job.id, version, data, usage=usage)
                self.jobs.record_checkpoint(
                    job.id,
                    version,
                    version,
                    folder,
                    step_metrics.checkpoint_metrics(data),
                )
                logger.warning(
                    f"job {job.id}: recorded checkpoint v{version} committed before "
                    "the restart"
                )
            if job.eval_id is not None:
                self._unvalidated(job, steps, state["version"])

    def _unvalidated(self, job: Job, steps: dict[int, Any], committed: int) -> None:
        """Steps recorded before a restart whose metrics event waited for a
        validation that never returned: their event without validation scores,
        so every step still has one (the resumed job evaluates only new steps)."""
        have = self.jobs.metrics_steps(job.id)
        for version in sorted(set(range(1, committed + 1)) - have):
            row = steps.get(version)
            if row is None:
                continue
            data = step_metrics.step_data(cast(StepRecord, row), job.steps_total)
            self.jobs.add_event(
                job.id, step_metrics.message(data), type="metrics", data=data
            )
            self.jobs.add_event(
                job.id,
                f"step {version}: its validation did not finish before the service "
                "restarted; its metrics have no validation scores",
                level="warn",
            )
