"""``marlaas service``: one long-running process that starts the multi-LoRA vLLM
server, the trainer (any placement ``marlaas train`` supports), the scheduler and
the HTTP API, and runs tenants' jobs as tasks that join and leave the running
scheduler.

The job store is the seam: the API inserts requests (jobs, cancel / pause /
resume) and reads; this runner is the only writer of progress. A poller moves
jobs along (``validating_files -> queued``), hands queued jobs to the runtime
(KV admission decides when they roll out: ``running`` from the first rollout),
and applies requested actions; the runtime's callbacks record steps, checkpoints
and endings. The run store under the service root holds the adapters and is the
source of truth for weights: a restarted service resumes every unfinished job
from its last committed version, and adds any checkpoint the store committed
but the database missed.
"""

from __future__ import annotations

import io
import shutil
import tarfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, cast

from areal.utils import logging
from areal.utils.hf_utils import load_hf_tokenizer

from areal_marlaas import admission
from areal_marlaas.config.service import ServiceRunConfig
from areal_marlaas.rollout.server_metrics import scrape
from areal_marlaas.rundir.reader import task_steps
from areal_marlaas.rundir.records import EvalRecord, EvalSample, StepRecord
from areal_marlaas.scheduler.backends import TaskStatus
from areal_marlaas.scheduler.runtime import Runtime, RuntimeOptions
from areal_marlaas.scheduler.tasks import eval_due
from areal_marlaas.service import eval_runs, step_metrics
from areal_marlaas.service import jobs as jobspec
from areal_marlaas.service.grading import service_grader_validator
from areal_marlaas.service.prometheus import ServiceMetrics
from areal_marlaas.service.router import VLLMModelRouter
from areal_marlaas.service.server import run_api
from areal_marlaas.service.store import JobStore, checkpoint_name
from areal_marlaas.service.tables import (
    CANCELLED,
    PAUSED,
    QUEUED,
    RUNNING,
    SUCCEEDED,
    TERMINAL,
    VALIDATING,
    Job,
)
from areal_marlaas.train.stack import TrainingStack, add_tenant

logger = logging.getLogger("MARLaaSServiceRunner")


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
    trained_tokens: int = 0
    # Validation (a job with a validation file): its eval, how often, and the
    # step records whose metrics event waits for their eval's scores.
    eval_id: str | None = None
    eval_every: int = 0
    start_version: int = 0
    pending: dict[int, StepRecord] = field(default_factory=dict)
    # Commit times of its newest steps in this process (the job's ETA).
    commits: list[float] = field(default_factory=list)


def stack_config(cfg: ServiceRunConfig) -> ServiceRunConfig:
    """The service's training stack: its run directory under the service root
    (checkpoints point into it), never started over (jobs resume from it)."""
    cfg.cluster.fileroot = str(cfg.service.root_dir / "runs")
    cfg.resume = True
    return cfg


class ServiceRunner:
    """A training stack whose tasks come from the job store instead of a YAML,
    the HTTP API beside it, and the poller between the two."""

    def __init__(self, cfg: ServiceRunConfig, stop: threading.Event | None = None):
        self.cfg = stack_config(cfg)
        self.svc = cfg.service
        self.stack = TrainingStack(cfg, title="marlaas service")
        self.store = self.stack.store
        self.stop = stop or threading.Event()
        self.jobs = JobStore.from_config(self.svc)
        self.metrics = ServiceMetrics(self.jobs)
        self.admitted: dict[str, Admitted] = {}  # task name -> job
        self._lock = threading.Lock()
        self.runtime: Runtime | None = None
        self.api = None
        self.tokenizer = None
        self._busy_mark = (time.monotonic(), 0.0)

    # -- lifecycle ----------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        # Imported here: only run() is this feature's (the module is others').
        from areal_marlaas.service.webhooks import WebhookDispatcher

        cfg, stack = self.cfg, self.stack
        poller = None
        # Its own threads: no job, poll or scheduler callback waits on HTTP.
        webhooks = WebhookDispatcher(self.jobs, self.svc)
        try:
            webhooks.start()  # first: what the last run left pending resumes now
            stack.start_trainer()
            rollout = stack.start_rollout()
            assert stack.session is not None  # start_rollout set it
            self.tokenizer = load_hf_tokenizer(cfg.tokenizer_path)
            stack.runtime = self.runtime = Runtime(
                [], rollout, stack.train_backend(), self.store, self._options()
            )
            stack.start_stats(10**6)  # open-ended: jobs keep arriving
            self._reconcile()
            router = VLLMModelRouter(
                self.jobs,
                stack.session.addresses[0],
                self.svc.base_model,
                cfg.vllm.model,
                self.svc.inference_adapters,
            )
            self.api = run_api(
                self.svc,
                self.jobs,
                router,
                service_grader_validator(self.svc.grader_kinds, cfg.grading),
                self.metrics,
                grading=cfg.grading,
            )
            stack.screen.phase(f"serving the API on {self.api.base_url}")
            poller = threading.Thread(
                target=self._poll, name="marlaas-jobs", daemon=True
            )
            poller.start()
            summary = self.runtime.serve(self.stop)
            stack.screen.phase("drained: every job stopped at a committed version")
        finally:
            self.stop.set()
            if poller is not None:
                poller.join(timeout=30)
            webhooks.stop()  # what is still pending goes out after the restart
            if self.api is not None:
                self.api.stop()
            stack.close()
            self.jobs.close()
        return summary

    def _options(self) -> RuntimeOptions:
        options = self.stack.runtime_options(on_step=self._progress)
        options.on_status = self._on_status
        options.on_publish = self._on_publish
        options.on_eval = self._on_eval
        options.max_tasks = self.svc.max_tasks
        options.release_finished = True
        return options

    # -- the poller: store -> runtime -------------------------------------------
    def _poll(self) -> None:
        while not self.stop.wait(self.svc.poll_interval_s):
            try:
                self._apply_actions()
                self._validate()
                self._admit()
                self._gauges()
            except Exception:  # the poller must survive one bad job or query
                logger.error(f"job poller: {traceback.format_exc()}")

    def _apply_actions(self) -> None:
        for action in self.jobs.pending_actions():
            job = self.jobs.job(action.job_id)
            outcome = self._apply(action.action, job)
            self.jobs.mark_action_handled(action.id, outcome)

    def _apply(self, what: str, job: Job) -> str:
        if job.status in TERMINAL:
            return "ignored: the job has ended"
        with self._lock:
            held = self.admitted.get(job.task_name)
        if what == "cancel":
            if held is not None:
                assert self.runtime is not None  # it admitted the job
                self.runtime.cancel(job.task_name)  # status set when it ends
                return "applied"
            self.jobs.set_status(job.id, CANCELLED, "Cancelled before it started")
            return "applied"
        if what == "pause":
            if job.status == PAUSED:
                return "ignored: already paused"
            if held is not None:
                held.paused_by_tenant = True
                assert self.runtime is not None  # it admitted the job
                self.runtime.pause(job.task_name)  # paused after its step commits
                return "applied"
            self.jobs.set_status(job.id, PAUSED, "Paused before it started")
            return "applied"
        if what == "resume":
            if job.status != PAUSED:
                return "ignored: not paused"
            if held is not None:
                held.paused_by_tenant = False
                assert self.runtime is not None  # it admitted the job
                self.runtime.resume(job.task_name)
                status = RUNNING if held.started else QUEUED
                self.jobs.set_status(job.id, status, "Fine-tuning job resumed")
                return "applied"
            # Never admitted: validate again (idempotent) and queue.
            self.jobs.set_status(job.id, VALIDATING, "Resumed; validating files")
            return "applied"
        return f"ignored: unknown action {what!r}"

    def _validate(self) -> None:
        for job in self.jobs.jobs_with_status(VALIDATING):
            if self.stop.is_set():
                return
            try:
                self._check_files(job)
            except jobspec.JobFileError as e:
                self.jobs.fail_job(job.id, "invalid_file", str(e), e.param)
                continue
            self.jobs.set_status(job.id, QUEUED)

    def _check_files(self, job: Job) -> None:
        grader = job.method["reinforcement"]["grader"]
        for which in ("training_file", "validation_file"):
            if getattr(job, which) is None:
                continue
            path = self.jobs.file_of_job(job.id, which)
            lines, too_long = jobspec.check_lines(
                path, grader, self.tokenizer, self.svc.max_prompt_tokens, which
            )
            if too_long:
                self.jobs.add_event(
                    job.id,
                    f"{too_long} of {lines} lines of the {which} have prompts over "
                    f"{self.svc.max_prompt_tokens} tokens; they are skipped",
                    level="warn",
                )
        spec = self._spec(job)
        kv, session = self.stack.kv, self.stack.session
        need = kv.task_bytes(spec)
        assert session is not None  # jobs are polled once it started
        capacity = admission.capacity(self.cfg, kv, session.addresses[0])
        budget = admission.budget(self.cfg, capacity)
        if budget is not None and need > budget:
            raise jobspec.JobFileError(
                f"a step of batch_size x group size = "
                f"{spec.batch_size * spec.n_samples} samples needs "
                f"{need / 2**20:.0f} MiB of KV cache but the server holds "
                f"{budget / 2**20:.0f} MiB; lower batch_size or compute_multiplier",
                "method.reinforcement.hyperparameters.batch_size",
            )
        need = kv.eval_bytes(spec)
        if spec.eval_interval and budget is not None and need > budget:
            raise jobspec.JobFileError(
                f"an eval of eval_samples = {spec.eval_samples} rows needs "
                f"{need / 2**20:.0f} MiB of KV cache but the server holds "
                f"{budget / 2**20:.0f} MiB; lower eval_samples",
                "method.reinforcement.hyperparameters.eval_samples",
            )

    def _spec(self, job: Job):
        valid = (
            self.jobs.file_of_job(job.id, "validation_file")
            if job.validation_file
            else None
        )
        return jobspec.task_spec(job, self.svc, self.jobs.file_of_job(job.id), valid)

    def _admit(self) -> None:
        """Hand queued (and, after a restart, running) jobs to the runtime, as far
        as the per-tenant running limit and ``service.max_tasks`` allow."""
        running = self.jobs.jobs_with_status(RUNNING)
        queued = self.jobs.jobs_with_status(QUEUED)
        with self._lock:
            held = {t: a.tenant_id for t, a in self.admitted.items()}
        for job in jobspec.to_admit(
            running + queued, held, self.svc.max_running_jobs, self.svc.max_tasks
        ):
            if self.stop.is_set():
                return
            self._hand_over(job)

    def _hand_over(self, job: Job) -> None:
        try:
            spec = self._spec(job)
            eval_id = None
            if spec.eval_interval:
                grader = job.method["reinforcement"]["grader"]
                criteria = eval_runs.testing_criteria(grader)
                eval_id = self.jobs.ensure_eval(job.id, criteria)
        except Exception as e:  # a job the plugin cannot express fails alone
            self.jobs.fail_job(job.id, "setup_failed", f"{type(e).__name__}: {e}")
            return
        runtime = self.runtime
        assert runtime is not None  # jobs are polled once it started
        grading = self.cfg.grading.to_dict()

        def add():  # on its trainer's thread: never beside a step there
            return add_tenant(
                self.stack.engine,
                spec,
                self.store,
                self.tokenizer,
                self.cfg,
                self.stack.kv,
                resume=self.store.committed(spec.name) is not None,
                grading=grading,
            )

        try:
            task = runtime.on_trainer(add, trainer=runtime.place(spec.name)).result()
        except Exception as e:
            runtime.unplace(spec.name)
            self.jobs.fail_job(
                job.id, "setup_failed", f"{type(e).__name__}: {e}", "training_file"
            )
            return
        rollout = self.stack.rollout
        assert rollout is not None  # jobs are handed over once it started
        rollout.register_task(
            spec.name,
            task.start_version,
            self.store.adapter_dir(spec.name, task.start_version),
        )
        with self._lock:
            self.admitted[spec.name] = Admitted(
                job.id,
                job.tenant_id,
                spec.name,
                spec.total_steps,
                eval_id=eval_id,
                eval_every=spec.eval_interval,
                start_version=task.start_version,
            )
        self.jobs.set_plan(job.id, steps_total=spec.total_steps)
        self.stack.screen.add(spec.name, task.start_version, spec.total_steps)
        runtime.add(task)
        logger.info(f"job {job.id} handed to the scheduler as {spec.name}")

    def _gauges(self) -> None:
        # The poller calls this once both started.
        session = self.stack.session
        assert self.runtime is not None and session is not None
        now, busy = time.monotonic(), self.runtime.train_busy_s
        t0, b0 = self._busy_mark
        if now - t0 >= 5:
            share = (busy - b0) / (now - t0) / self.runtime.trainer_count
            self.metrics.set_trainer_busy(min(1.0, share))
            self._busy_mark = (now, busy)
            try:
                m = scrape(session.addresses[0], timeout=2)
                self.metrics.set_kv_usage(m.kv_cache_usage)
            except Exception:  # the gauge is best effort
                pass

    # -- the runtime's callbacks: runtime -> store --------------------------------
    def _job_of(self, task: str) -> Admitted | None:
        with self._lock:
            return self.admitted.get(task)

    def _on_status(self, task: str, status: TaskStatus, reason: str) -> None:
        held = self._job_of(task)
        if held is None:
            return
        job_id = held.job_id
        if status == TaskStatus.HELD:
            if not held.started and not held.waiting:
                held.waiting = True
                why = {"kv": "the server's KV-cache budget is full"}.get(
                    reason, f"admission ({reason})"
                )
                self.jobs.add_event(
                    job_id, f"Waiting to start: {why}; it starts when a slot frees"
                )
        elif status == TaskStatus.RUNNING:
            held.started = True
            if self.jobs.job(job_id).status == QUEUED:
                self.jobs.set_status(job_id, RUNNING)
        elif status == TaskStatus.PAUSED:
            if held.paused_by_tenant and not self.stop.is_set():
                self.jobs.set_status(job_id, PAUSED, "Paused after a committed step")
        elif status == TaskStatus.DONE:
            self._finish(held)
        elif status in (TaskStatus.FAILED, TaskStatus.CANCELLED):
            self._flush(held)
            with self._lock:
                self.admitted.pop(task, None)
            if status == TaskStatus.CANCELLED:
                self.jobs.set_status(job_id, CANCELLED)
            else:
                self.jobs.fail_job(job_id, "training_failed", reason or "failed")

    def _finish(self, held: Admitted) -> None:
        """The final adapter as a result file (a tar.gz of the PEFT folder), then
        ``succeeded``."""
        state = self.store.committed(held.task)
        self._flush(held)
        try:
            assert state is not None  # the job finished at a committed version
            folder = self.store.adapter_dir(held.task, state["version"])
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w:gz") as tar:
                for f in sorted(folder.iterdir()):
                    if f.name != "optimizer.pt":  # the adapter, not the trainer state
                        tar.add(f, arcname=f.name)
            job = self.jobs.job(held.job_id)
            name = f"{job.fine_tuned_model or held.task}.adapter.tar.gz"
            self.jobs.add_result_file(
                held.job_id, name.replace(":", "_"), buf.getvalue()
            )
            self.jobs.set_status(held.job_id, SUCCEEDED)
        except Exception as e:
            self.jobs.fail_job(held.job_id, "result_failed", f"{type(e).__name__}: {e}")
        finally:
            with self._lock:
                self.admitted.pop(held.task, None)

    def _progress(self, r: StepRecord, stats: dict[str, float]) -> None:
        self.stack.log_step(r, stats)
        held = self._job_of(r["task"])
        if held is None:
            return
        data = step_metrics.step_data(r, held.total_steps)
        version = r["version"]
        held.trained_tokens += int(r.get("trained_tokens") or 0)
        # An evaluated step's metrics event waits for its validation scores.
        due = held.eval_id is not None and eval_due(
            version, held.eval_every, held.total_steps, held.start_version
        )
        if due:
            held.pending[version] = r
        held.commits = [*held.commits[-ETA_WINDOW:], r["t_commit"]]
        self.jobs.record_step(
            held.job_id,
            version,
            data,
            trained_tokens=held.trained_tokens,
            estimated_finish=step_metrics.estimated_finish(
                held.commits, held.total_steps - version
            ),
            at=r["t_commit"],
            event=not due,
        )
        self.jobs.record_checkpoint(
            held.job_id,
            version,
            version,
            self.store.adapter_dir(r["task"], version),
            step_metrics.checkpoint_metrics(data),
        )
        self._prune(held)
        self.metrics.observe_step(held.tenant_id, r["train_s"])
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

    def _prune(self, held: Admitted) -> None:
        """Drop the checkpoints beyond the newest and the best ones (those whose
        validation runs stay), rows first: a crash between the two leaves only
        files that nothing names."""
        job_id = held.job_id
        by = "valid_reward_mean" if held.eval_id else "train_reward_mean"
        for step, path in self.jobs.prune_checkpoints(
            job_id, self.svc.keep_checkpoints, by, frozenset(held.pending)
        ):
            shutil.rmtree(self.jobs.root / path, ignore_errors=True)
            logger.info(f"job {job_id}: deleted checkpoint step {step} ({path})")

    def _on_eval(self, r: EvalRecord, samples: list[EvalSample]) -> None:
        """A step's validation: an eval run with its samples, then the step's
        metrics event with its validation scores, the checkpoint's metrics and
        the retention that ranks by them."""
        self.stack.log_eval(r, samples)
        held = self._job_of(r["task"])
        if held is None or held.eval_id is None:
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
        )
        record = held.pending.pop(version, None)
        if record is not None:
            valid = None
            if r["reward_mean"] is not None:
                valid = {"reward_mean": r["reward_mean"], "graders": r["graders"]}
            self._metrics_event(held, record, valid, r["end"] - r["start"])
        self._prune(held)

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

    def _flush(self, held: Admitted) -> None:
        """A job ending with evals that never ran: their steps' events without
        validation scores."""
        for version in sorted(held.pending):
            self._metrics_event(held, held.pending.pop(version))

    def _on_publish(self, task: str, version: int) -> None:
        """Nothing to do per publish yet (evaluation would hook in here)."""

    # -- restart ----------------------------------------------------------------
    def _reconcile(self) -> None:
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
                    self.jobs.record_step(job.id, version, data)
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


def main(argv: list[str]) -> int:
    """``marlaas service --config X.yaml [key=value ...]``: serve until SIGTERM or
    Ctrl-C, then drain (every job stops at a committed version; the next start
    resumes it). A second Ctrl-C stops at once."""
    import signal

    from areal_marlaas.config import load_config
    from areal_marlaas.train.screen import quiet_logs

    cfg, _ = load_config(argv, schema=ServiceRunConfig)
    quiet_logs(cfg, cfg.service.root_dir / "logs")
    stop = threading.Event()

    def on_signal(signum, frame):
        if stop.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt
        print("[marlaas service] stopping: draining running jobs", flush=True)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    ServiceRunner(cfg, stop).run()
    return 0
