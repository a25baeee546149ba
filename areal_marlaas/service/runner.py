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
import tarfile
import threading
import time
import traceback
from typing import Any

from areal.utils import logging
from areal.utils.hf_utils import load_hf_tokenizer

from areal_marlaas import admission
from areal_marlaas.config.service import ServiceRunConfig
from areal_marlaas.graders import public_grader
from areal_marlaas.methods import Method
from areal_marlaas.procs import close_each
from areal_marlaas.rollout.controller import MultiTaskRolloutController
from areal_marlaas.rollout.server_metrics import scrape
from areal_marlaas.rundir.records import EvalRecord, EvalSample, StepRecord
from areal_marlaas.scheduler.backends import TaskStatus
from areal_marlaas.scheduler.events import HoldReason
from areal_marlaas.scheduler.runtime import Runtime, RuntimeOptions
from areal_marlaas.service import eval_runs
from areal_marlaas.service import jobs as jobspec
from areal_marlaas.service.grading import service_grader_validator
from areal_marlaas.service.prometheus import ServiceMetrics
from areal_marlaas.service.recorder import Admitted, JobRecorder
from areal_marlaas.service.router import VLLMModelRouter
from areal_marlaas.service.server import run_api
from areal_marlaas.service.store import JobStore
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
from areal_marlaas.service.validation import JobType, job_type
from areal_marlaas.train.stack import TrainingStack, add_tenant

logger = logging.getLogger("MARLaaSServiceRunner")


def _checkpoint_ranking(spec) -> dict:
    """How a job's best checkpoints are picked: a supervised or DPO job's by
    its validation loss (its training loss without a validation file), lowest
    first; a reinforcement job's by its reward (the recorder's default)."""
    if Method(spec.method).rolls_out:
        return {}
    by = "valid_loss" if spec.eval_dataset is not None else "train_loss"
    return {"rank_by": by, "higher_is_better": False}


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
        self.recorder = JobRecorder(self.jobs, self.store, self.svc, self.metrics)
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
            self.recorder.reconcile()
            ctrl = stack.session.engine
            stage = None
            if isinstance(ctrl, MultiTaskRolloutController) and ctrl.push:
                stage = ctrl.stage_files
            router = VLLMModelRouter(
                self.jobs,
                stack.session.addresses[0],
                self.svc.base_model,
                cfg.vllm.model,
                self.svc.inference_adapters,
                stage=stage,
            )
            self.api = run_api(
                self.svc,
                self.jobs,
                router,
                service_grader_validator(self.svc.grader_kinds, cfg.grading),
                self.metrics,
                grading=cfg.grading,
                tokenizer=self.tokenizer,
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
            api = self.api
            close_each(
                [
                    ("the job poller", lambda: poller and poller.join(timeout=30)),
                    # What is still pending goes out after the restart.
                    ("the webhooks", webhooks.stop),
                    ("the API", lambda: api and api.stop()),
                    ("the training stack", stack.close),
                    ("the job store", self.jobs.close),
                ],
                logger,
            )
        return summary

    def _options(self) -> RuntimeOptions:
        options = self.stack.runtime_options(on_step=self._progress)
        options.on_status = self._on_status
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
                self._reweigh()
                self._gauges()
            except Exception:  # the poller must survive one bad job or query
                logger.error(f"job poller: {traceback.format_exc()}")

    def _reweigh(self) -> None:
        """Tenants whose weight the operator changed: their held jobs' tasks
        are charged at the new weight from now on."""
        weights = self.jobs.tenant_weights()
        with self._lock:
            held = list(self.admitted.values())
        for h in held:
            w = weights.get(h.tenant_id, 1.0)
            if w != h.weight and self.runtime is not None:
                self.runtime.reweight(h.task, w)
                h.weight = w

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
        kind = job_type(job.method)
        if kind is not JobType.REINFORCEMENT:
            for which in ("training_file", "validation_file"):
                if getattr(job, which) is not None:
                    jobspec.check_example_lines(
                        kind.train_method,
                        self.jobs.file_of_job(job.id, which),
                        self.tokenizer,
                        self.svc.supervised_max_tokens,
                        which,
                    )
            return
        rl = job.method["reinforcement"]
        grader = rl["grader"]
        tools = {t["name"] for t in rl["tools"]} if rl.get("tools") else None
        for which in ("training_file", "validation_file"):
            if getattr(job, which) is None:
                continue
            path = self.jobs.file_of_job(job.id, which)
            limit = jobspec.prompt_limit(self.svc, job)
            lines, too_long = jobspec.check_lines(
                path, grader, self.tokenizer, limit, which, tools
            )
            if too_long:
                self.jobs.add_event(
                    job.id,
                    f"{too_long} of {lines} lines of the {which} have prompts over "
                    f"{limit} tokens; they are skipped",
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
        weight = self.jobs.tenant_weights().get(job.tenant_id, 1.0)
        return jobspec.task_spec(
            job,
            self.svc,
            self.jobs.file_of_job(job.id),
            valid,
            weight=weight,
            egress=self._egress(job),
            init_adapter=self.jobs.start_adapter(job.id),
        )

    def _egress(self, job: Job):
        """The job's tenant's egress policy, as the operator's config says now."""
        return self.svc.egress.policy(self.jobs.tenant(job.tenant_id).name)

    def _admit(self) -> None:
        """Hand queued (and, after a restart, running) jobs to the runtime, as far
        as the per-tenant running limit and ``service.max_tasks`` allow."""
        # What it holds first, then the store: a job that ends meanwhile leaves
        # ``admitted`` only after its terminal status is written (``_on_status``),
        # so a stale ``running`` row is always of a job still in this snapshot.
        with self._lock:
            held = {t: a.tenant_id for t, a in self.admitted.items()}
        running = self.jobs.jobs_with_status(RUNNING)
        queued = self.jobs.jobs_with_status(QUEUED)
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
                grader = public_grader(job.method["reinforcement"]["grader"])
                criteria = eval_runs.testing_criteria(grader)
                eval_id = self.jobs.ensure_eval(job.id, criteria)
        except Exception as e:  # a job the plugin cannot express fails alone
            self.jobs.fail_job(job.id, "setup_failed", f"{type(e).__name__}: {e}")
            return
        runtime = self.runtime
        assert runtime is not None  # jobs are polled once it started
        # Endpoint graders connect under the tenant's egress policy.
        grading = {**self.cfg.grading.to_dict(), "egress": self._egress(job).to_dict()}

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
                weight=spec.weight,
                **_checkpoint_ranking(spec),
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
                if reason == HoldReason.LOAD:
                    self._queued_event(held)
                else:
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
            self.recorder.flush(held)
            try:
                if status == TaskStatus.CANCELLED:
                    self.jobs.set_status(job_id, CANCELLED)
                else:
                    self.jobs.fail_job(job_id, "training_failed", reason or "failed")
            finally:  # after the status: the poller must never see it running
                with self._lock:
                    self.admitted.pop(task, None)

    def _queued_event(self, held: Admitted) -> None:
        """A job that waits for room in the loop (scheduler.concurrency=adaptive):
        its position among the waiting and an estimated start, the k-th soonest
        estimated finish of the jobs in the loop (each leaving one frees room
        for about one job): a job's ETA from its commits, else its steps left x
        its measured cycle. Called on the runtime's dispatcher, which alone
        changes the core."""
        runtime = self.runtime
        assert runtime is not None and runtime.core.loop is not None
        core, loop = runtime.core, runtime.core.loop
        waiting = core.waiting_for_load()
        position = waiting.index(held.task) + 1 if held.task in waiting else 1
        now = time.time()

        def eta(h: Admitted) -> float | None:
            if h.eta is not None:
                return h.eta
            cycle, task = loop.cycle_s(h.task), core.tasks.get(h.task)
            if cycle is None or task is None:
                return None
            return now + (task.total_steps - task.steps_done) * cycle

        with self._lock:
            inside = [h for h in self.admitted.values() if loop.inside(h.task)]
        etas = sorted(x for h in inside if (x := eta(h)) is not None)
        start = etas[position - 1] if len(etas) >= position else None
        when = (
            f"estimated start in {max(0.0, start - now):.0f} s"
            if start is not None
            else "no estimated start until the running jobs have a pace"
        )
        self.jobs.add_event(
            held.job_id,
            f"Queued: position {position} of {len(waiting)}; the {loop.size} "
            f"running job(s) keep the trainer busy; {when}",
            data={
                "queue_position": position,
                "queue_length": len(waiting),
                "running": loop.size,
                "estimated_start": start,
            },
        )

    def _finish(self, held: Admitted) -> None:
        """The final adapter as a result file (a tar.gz of the PEFT folder), then
        ``succeeded``."""
        state = self.store.committed(held.task)
        self.recorder.flush(held)
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
        if held is not None:
            self.recorder.step(held, r)

    def _on_eval(self, r: EvalRecord, samples: list[EvalSample]) -> None:
        self.stack.log_eval(r, samples)
        held = self._job_of(r["task"])
        if held is not None:
            self.recorder.eval(held, r, samples)


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
