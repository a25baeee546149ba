"""The runtime that drives the scheduling core with real rollouts and training.

One dispatcher loop owns the core: it takes events from a queue, feeds them to the
core and starts the actions the core returns. Rollouts and publishes run on a
thread pool (one task never has two in flight, so the pool needs one thread per
task); each trainer runs its steps on a thread of its own. What the runtime calls
on the rollout side and on the trainers, and when, is in ``backends``: it always
gets a trainer pool (``train.pool.TrainerPool``, one engine or several).
Every mode (async, sync, sequential, collocated) is the same loop: only the core's
decisions differ, so every mode writes the same run-directory files.

Facts have one owner: a task's version is the trainer's (``train_task`` returns
the version it committed); the core, the run store and the rollout side are told.
"""

from __future__ import annotations

import queue
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from areal.utils import logging

from areal_marlaas import trajectory
from areal_marlaas.methods import Method
from areal_marlaas.rundir.records import (
    EvalRecord,
    EvalSample,
    StepRecord,
    StepResult,
)
from areal_marlaas.rundir.writer import RunStore
from areal_marlaas.scheduler.backends import RolloutBackend, TaskStatus, TrainBackend
from areal_marlaas.scheduler.core import (
    Action,
    AdmissionError,
    Cancel,
    Concurrency,
    EvalDone,
    FinishTask,
    HoldRollout,
    KVUsage,
    Mode,
    Pause,
    Phase,
    PublishDone,
    Resume,
    Reweight,
    RolloutDone,
    RolloutOrder,
    SchedulerCore,
    StartEval,
    StartPublish,
    StartRollout,
    StartTrain,
    Submitted,
    TaskError,
    TaskPaused,
    TrainDone,
    TrainOrder,
)
from areal_marlaas.scheduler.evals import failed_eval, run_eval
from areal_marlaas.scheduler.summary import summarize
from areal_marlaas.tasks.prompt_order import TaskData

logger = logging.getLogger("MARLaaSRuntime")


# A method's scores part of a step result, and the validation scores that are
# also reported as full validation when the step scored every example.
_FULL_VALID = {
    "supervised": ("loss", "mean_token_accuracy"),
    "preference": ("loss", "preference_accuracy"),
}


class VersionMismatchError(RuntimeError):
    """The trainer committed a version the scheduler did not expect."""


@dataclass
class TaskRun:
    """What the runtime needs to run one task."""

    name: str
    total_steps: int
    batch_size: int
    n_samples: int
    data: TaskData
    workflow: str
    workflow_kwargs: dict[str, Any]
    start_version: int = 0
    kv_bytes: int = 0  # KV footprint of one rollout batch (admission)
    priority: int = 0
    # Held-out rows evaluated after every eval_every-th version and the last
    # (scheduler.evals), and one eval's KV footprint.
    eval_rows: list[dict[str, Any]] | None = None
    eval_every: int = 0
    eval_kv_bytes: int = 0
    # Fair share (scheduler.train_order=fair): its tenant ("": its own name)
    # and the tenant's weight.
    tenant: str = ""
    weight: float = 1.0
    # What its steps optimize: GRPO rolls ``data``'s prompts out; SFT trains on
    # ``data``'s tokenized examples (no rollout) and, with ``valid``, is scored
    # on its next batch_size examples after each step and on all of
    # ``valid_full`` after the last.
    method: Method = Method.GRPO
    valid: TaskData | None = None
    valid_full: list[dict[str, Any]] | None = None
    # filled while running
    submitted_at: float = 0.0
    ready_at: float = 0.0  # when it last became ready to roll out
    rollout_start: float = 0.0
    rollout_end: float = 0.0
    batch: list[dict[str, Any]] | None = None
    discarded: int = 0  # groups of the batch that failed or were discarded
    rewards: list[float] = field(default_factory=list)
    commits: list[float] = field(default_factory=list)
    evals: list[tuple[int, float | None]] = field(default_factory=list)
    error: str = ""


@dataclass
class RuntimeOptions:
    """How the runtime schedules: the mode, admission and retries."""

    mode: Mode = Mode.ASYNC
    kv_budget: int | None = None  # bytes; None = unlimited
    max_rolling: int | None = None
    task_retries: int = 0
    train_order: TrainOrder = TrainOrder.FIFO
    rollout_order: RolloutOrder = RolloutOrder.FIFO
    concurrency: Concurrency = Concurrency.OFF
    target_load: float = 1.0
    rollout_timeout: float | None = None
    # Returns the server's KV bytes in use, or None when it cannot be read;
    # polled every kv_poll_interval_s while no other event arrives.
    kv_probe: Callable[[], int | None] | None = None
    kv_poll_interval_s: float = 1.0
    keep_adapters: int = 0
    save_retries: int = 2
    # Called after every committed step with its steps.jsonl record and stats.
    on_step: Callable[[StepRecord, dict[str, float]], None] | None = None
    # Called (from the dispatcher) when a task's TaskStatus changes, with a
    # reason (for HELD the admission's: kv|cap|barrier|turn|load).
    on_status: Callable[[str, TaskStatus, str], None] | None = None
    # Called after a new version is live on the server.
    on_publish: Callable[[str, int], None] | None = None
    # Called after a version's eval (its evals.jsonl record and samples).
    on_eval: Callable[[EvalRecord, list[EvalSample]], None] | None = None
    # Tasks that may exist at once (thread pool size); 0 = the tasks given.
    max_tasks: int = 0
    # A task that ended leaves the trainer and the server (the job service).
    release_finished: bool = False


@dataclass(frozen=True)
class _Add:
    """A task that arrives while the runtime runs."""

    task: TaskRun


class Runtime:
    def __init__(
        self,
        tasks: list[TaskRun],
        rollout: RolloutBackend,
        trainer: TrainBackend,
        store: RunStore,
        options: RuntimeOptions | None = None,
    ):
        self.options = opts = options or RuntimeOptions()
        self.tasks = {t.name: t for t in tasks}
        self.rollout = rollout
        self.trainer = trainer
        # A task trains on the trainer that holds its state; each trainer has
        # its own thread.
        self.trainer_count = int(trainer.count)
        self.store = store
        self.core = SchedulerCore(
            trainers=self.trainer_count,
            mode=opts.mode,
            kv_budget=opts.kv_budget,
            max_rolling=opts.max_rolling,
            task_retries=opts.task_retries,
            train_order=opts.train_order,
            rollout_order=opts.rollout_order,
            concurrency=opts.concurrency,
            target_load=opts.target_load,
        )
        self.events: queue.Queue = queue.Queue()
        self._workers = ThreadPoolExecutor(
            max(opts.max_tasks, len(tasks)) + 1, "marlaas-task"
        )
        # Evals never take a task's rollout or publish thread.
        self._evals = ThreadPoolExecutor(
            max(opts.max_tasks, len(tasks)) + 1, "marlaas-eval"
        )
        self._trainers = [
            ThreadPoolExecutor(1, f"marlaas-trainer{i}")
            for i in range(self.trainer_count)
        ]
        self.started_at = 0.0
        self.rejected: dict[str, str] = {}  # tasks refused at submission
        self.holds = 0
        self.kv_peak_reported = 0
        self._started: set[str] = set()  # tasks that began rolling out here
        self.train_busy_s = 0.0  # trainers' busy time (summed), for gauges
        self._busy_lock = threading.Lock()
        self._rolling = 0  # rollout phases in flight (elastic placement reads it)
        self._rolling_lock = threading.Lock()

    # -- the job service's door: thread-safe, applied by the dispatcher ----------
    def add(self, task: TaskRun) -> None:
        """Run ``task`` too (it joins the running core; admission decides when)."""
        self.events.put(_Add(task))

    def cancel(self, task: str, reason: str = "cancelled") -> None:
        self.events.put(Cancel(task, reason))

    def pause(self, task: str) -> None:
        self.events.put(Pause(task))

    def reweight(self, task: str, weight: float) -> None:
        self.events.put(Reweight(task, weight))

    def resume(self, task: str) -> None:
        self.events.put(Resume(task))

    def on_trainer(self, fn: Callable, *args, trainer: int = 0) -> Future:
        """Run ``fn`` on trainer ``trainer``'s thread (between its training
        steps): adding a task to an engine must never overlap a step of another."""
        return self._trainers[trainer].submit(fn, *args)

    def place(self, task: str) -> int:
        """The trainer that will hold ``task`` (placed now if it is new)."""
        return int(self.trainer.place(task))

    def unplace(self, task: str) -> None:
        """Undo ``place`` for a task whose set-up failed."""
        self.trainer.unplace(task)

    def _trainer_of(self, task: str) -> int | None:
        """The trainer holding ``task``; None: any (not placed)."""
        return self.trainer.trainer_of(task)

    def _submitted(self, t: TaskRun) -> Submitted:
        return Submitted(
            t.name,
            t.total_steps,
            t.start_version,
            t.kv_bytes,
            t.priority,
            trainer=self._trainer_of(t.name),
            eval_every=t.eval_every if t.eval_rows else 0,
            eval_kv_bytes=t.eval_kv_bytes if t.eval_rows else 0,
            tenant=t.tenant,
            weight=t.weight,
            rollout=t.method.rolls_out,
        )

    def _shutdown(self) -> None:
        self._evals.shutdown(wait=True)
        self._workers.shutdown(wait=True)
        for trainer in self._trainers:
            trainer.shutdown(wait=True)

    @property
    def rollouts_running(self) -> int:
        """Rollout phases in flight now (their requests are on the server)."""
        return self._rolling

    def in_flight(self) -> list[str]:
        """Tasks with a phase running (a drain waits for none)."""
        busy = (Phase.ROLLOUT, Phase.QUEUED, Phase.TRAIN, Phase.PUBLISH)
        return [n for n, t in self.core.tasks.items() if t.phase in busy]

    # -- loop -------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        self.started_at = time.time()
        for t in self.tasks.values():
            t.submitted_at = t.ready_at = time.time()
            try:
                actions = self.core.handle(self._submitted(t))
            except AdmissionError as e:  # refused alone; the others still run
                self._reject(t, str(e))
                continue
            self._dispatch_all(actions)
        try:
            while self.core.tasks and not self.core.finished():
                self._handle(self._next_event())
        finally:
            self._shutdown()
        return self.summary(time.time() - self.started_at)

    def serve(self, stop: threading.Event, poll_s: float = 0.5) -> dict[str, Any]:
        """Run until ``stop`` is set, taking tasks as they arrive (``add``); then
        drain: every task stops after its current step is committed and
        published, and nothing is left in flight (a restart resumes from there)."""
        self.started_at = time.time()
        draining = False
        try:
            while True:
                if stop.is_set() and not draining:
                    draining = True
                    for name, t in self.core.tasks.items():
                        if t.active:
                            self._dispatch_all(self.core.handle(Pause(name)))
                if draining and not self.in_flight():
                    break
                event = self._next_event(wait_s=poll_s)
                if event is not None:
                    self._handle(event)
        finally:
            self._shutdown()
        return self.summary(time.time() - self.started_at)

    def _handle(self, event) -> None:
        if isinstance(event, _Add):
            t = event.task
            if t.name in self.core.tasks:  # a caller's bug: never crash the others
                logger.error(f"task {t.name} added twice; the second add is ignored")
                return
            self.tasks[t.name] = t
            t.submitted_at = t.ready_at = time.time()
            try:
                actions = self.core.handle(self._submitted(t))
            except AdmissionError as e:
                self._reject(t, str(e))
                if self.options.on_status is not None:
                    self.options.on_status(t.name, TaskStatus.FAILED, str(e))
                if self.options.release_finished:  # never runs: free what it holds
                    self._release(t.name)
                return
            self._dispatch_all(actions)
            return
        if isinstance(event, Reweight) and event.task not in self.core.tasks:
            return  # it ended and was released meanwhile
        self._dispatch_all(self.core.handle(event))

    def _next_event(self, wait_s: float | None = None):
        """The next event; while none arrives, the server's KV usage every
        ``kv_poll_interval_s`` (a probe that cannot read it just waits again).
        With ``wait_s``, None when nothing came within it."""
        probe = self.options.kv_probe
        deadline = None if wait_s is None else time.monotonic() + wait_s
        while True:
            if probe is None:
                try:
                    return self.events.get(timeout=wait_s)
                except queue.Empty:
                    return None
            timeout = self.options.kv_poll_interval_s
            if deadline is not None:
                timeout = max(0.0, min(timeout, deadline - time.monotonic()))
            try:
                return self.events.get(timeout=timeout)
            except queue.Empty:
                used = probe()
            if used is not None:
                self.kv_peak_reported = max(self.kv_peak_reported, used)
                return KVUsage(used)
            if deadline is not None and time.monotonic() >= deadline:
                return None

    def _reject(self, t: TaskRun, reason: str) -> None:
        logger.error(f"task {t.name} rejected: {reason}")
        t.error = reason
        self.rejected[t.name] = reason
        self._admission(t.name, t.start_version, "reject", reason)

    def _admission(self, task: str, version: int, what: str, reason: str = ""):
        """An admission record in events.jsonl (no "phase" key: not an interval)."""
        self.store.record(
            {
                "task": task,
                "version": version,
                "admission": what,
                "reason": reason,
                "kv_bytes": self.tasks[task].kv_bytes,
                "kv_in_use": self.core.kv_in_use(),
                "kv_reported": self.core.live_kv,
                "kv_budget": self.core.kv_budget,
                "rolling": self.core.rolling(),
                "t": time.time(),
            }
        )

    def _dispatch_all(self, actions: list[Action]) -> None:
        for action in actions:
            self._dispatch(action)

    def _status(self, task: str, status: TaskStatus, reason: str = "") -> None:
        if self.options.on_status is not None:
            try:
                self.options.on_status(task, status, reason)
            except Exception:  # a listener's bug must not stop the dispatcher
                logger.exception(f"on_status({task}, {status}) failed")

    def _dispatch(self, action: Action) -> None:
        if isinstance(action, StartRollout):
            self._admission(action.task, action.version, "admit")
            if action.task not in self._started:
                self._started.add(action.task)
                self._status(action.task, TaskStatus.RUNNING)
            self._workers.submit(self._guard, action.task, self._rollout, action)
        elif isinstance(action, HoldRollout):
            self.holds += 1
            self._admission(action.task, action.version, "hold", action.reason)
            self._status(action.task, TaskStatus.HELD, action.reason)
        elif isinstance(action, StartTrain):
            if action.task not in self._started:  # a task that never rolls out
                self._started.add(action.task)
                self._status(action.task, TaskStatus.RUNNING)
            self._trainers[action.trainer].submit(
                self._guard, action.task, self._train, action
            )
        elif isinstance(action, StartPublish):
            self._workers.submit(self._guard, action.task, self._publish, action)
        elif isinstance(action, StartEval):
            self._evals.submit(self._eval, action)
        elif isinstance(action, TaskPaused):
            self.store.record(
                {
                    "task": action.task,
                    "status": TaskStatus.PAUSED,
                    "version": action.version,
                }
                | {"t": time.time()}
            )
            self._status(action.task, TaskStatus.PAUSED)
        elif isinstance(action, FinishTask):
            state = TaskStatus.FAILED if action.failed else TaskStatus.DONE
            state = TaskStatus.CANCELLED if action.cancelled else state
            if action.failed:
                self.tasks[action.task].error = action.reason
                logger.error(f"task {action.task} failed: {action.reason}")
            else:
                logger.info(f"task {action.task} {state}")
            self.store.record(
                {
                    "task": action.task,
                    "status": state,
                    "reason": action.reason,
                    "t": time.time(),
                }
            )
            self._status(action.task, state, action.reason)
            if self.options.release_finished:
                self._release(action.task)

    def _release(self, task: str) -> None:
        """The task left: its trainer slot (on the trainer thread, after whatever
        it is doing) and its adapter on the server go; so do its rows."""
        t = self.tasks[task]
        t.batch = None
        thread = self._trainers[self._trainer_of(task) or 0]
        thread.submit(self._quietly, self.trainer.remove_task, task)
        self._workers.submit(self._quietly, self.rollout.remove_task, task)

    @staticmethod
    def _quietly(fn, *args) -> None:
        try:
            fn(*args)
        except Exception:
            logger.exception(f"{getattr(fn, '__name__', fn)}{args} failed")

    def _guard(self, task: str, fn, action) -> None:
        try:
            self.events.put(fn(action))
        except Exception as e:  # one tenant's failure never stops the others
            reason = f"{type(e).__name__}: {e}"
            logger.error(
                f"task {task} {type(action).__name__} v{action.version} failed: "
                f"{reason}\n{traceback.format_exc()}"
            )
            self.tasks[task].ready_at = time.time()
            self.events.put(TaskError(task, reason))

    # -- phases -----------------------------------------------------------------
    def _rollout(self, a: StartRollout) -> RolloutDone:
        t = self.tasks[a.task]
        start = time.time()
        if start - t.ready_at > 0.05:  # held by admission, a barrier or its turn
            self.store.event(a.task, a.version, "wait", t.ready_at, start)
        rows = t.data.next_batch(t.batch_size)
        self.rollout.set_priority(a.task, a.priority)
        with self._rolling_lock:
            self._rolling += 1
        try:
            results = self.rollout.rollout_task(
                rows,
                t.workflow,
                t.workflow_kwargs,
                t.n_samples,
                self.options.rollout_timeout,
            )
        finally:
            with self._rolling_lock:
                self._rolling -= 1
        reasons = [trajectory.failure_reason(x) for x in results]
        ok = [
            x
            for x, why in zip(results, reasons, strict=True)
            if x is not None and why is None
        ]
        if not ok:
            why = next((r for r in reasons if r), "no trajectory came back")
            raise RuntimeError(
                f"all {len(results)} rollouts of v{a.version} failed; last error: {why}"
            )
        failed = len(results) - len(ok)
        if failed:
            logger.warning(
                f"task {a.task} v{a.version}: {failed} of {len(results)} episodes "
                f"failed ({next(r for r in reasons if r)}); training on the rest"
            )
        t.batch, t.discarded = ok, failed
        t.rollout_start, t.rollout_end = start, time.time()
        self.store.event(a.task, a.version, "rollout", start, t.rollout_end)
        for env_start, env_end in trajectory.env_intervals(ok):
            self.store.event(a.task, a.version, "env", env_start, env_end)
        self._admission(a.task, a.version, "release")
        return RolloutDone(
            a.task,
            a.version,
            trajectory.generated_tokens(ok),
            rollout_s=t.rollout_end - start,
        )

    def _train(self, a: StartTrain) -> TrainDone:
        t = self.tasks[a.task]
        start = time.time()
        try:
            return self._train_step(a, t, start)
        finally:
            with self._busy_lock:
                self.train_busy_s += time.time() - start

    def _train_step(self, a: StartTrain, t: TaskRun, start: float) -> TrainDone:
        if not t.method.rolls_out:
            return self._train_examples(a, t, start)
        self.store.event(a.task, a.version, "queue", t.rollout_end, start)
        batch, t.batch = t.batch, None
        assert batch is not None  # the rollout left it
        rewards = trajectory.rewards(batch)
        staleness = trajectory.staleness(batch, a.version)
        result = self.trainer.train_task(a.task, batch)
        self.trainer.release_batch(batch)
        new = self._committed(a, result)
        end = time.time()
        record: StepRecord = {
            "task": a.task,
            "version": new,
            "reward_mean": float(rewards.mean()),
            "staleness_max": staleness,
            "n_trajectories": int(rewards.numel()),
            "trained_tokens": trajectory.generated_tokens(batch),
            "rollout_s": t.rollout_end - t.rollout_start,
            "queue_wait_s": start - t.rollout_end,
            "trainer": a.trainer,
            "train_s": end - start,
            "t_commit": end,
            "loss": result["loss"],
            "grad_norm": result["grad_norm"],
            **result["audit"],
            **result["process"],
        }
        placement = result.get("placement")
        if placement is not None:
            record["cores_mean"] = placement["cores_mean"]
            record["borrowed_s"] = placement["borrowed_s"]
        reasons = trajectory.reward_reasons(batch)
        if reasons:
            record["reward_reasons"] = reasons
        graders = trajectory.grader_stats(batch)
        if graders:
            record["graders"] = graders
        record["discarded_groups"] = t.discarded
        tools = trajectory.tool_use(batch)
        if tools is not None:
            record["tools"] = tools
        t.rewards.append(float(rewards.mean()))
        return self._record(a, t, record, result["stats"], start)

    def _committed(self, a: StartTrain, result: StepResult) -> int:
        """The version the trainer committed, saved; it must be the next one."""
        new = int(result["version"])
        if new != a.version + 1:
            raise VersionMismatchError(
                f"task {a.task}: the trainer committed v{new} for a batch of "
                f"v{a.version}"
            )
        self._save(a.task, new, str(self.store.adapter_dir(a.task, new)))
        return new

    def _record(
        self,
        a: StartTrain,
        t: TaskRun,
        record: StepRecord,
        stats: dict[str, float],
        start: float,
    ) -> TrainDone:
        new, end = record["version"], record["t_commit"]
        # The step line goes first: a crash between the two leaves a line newer
        # than state.json, which a resumed store drops (never a missing line).
        self.store.step(record)
        state = {"cursor": t.data.cursor, "steps": new}
        if t.valid is not None:
            state["valid_cursor"] = t.valid.cursor
        self.store.commit(a.task, new, state)
        self.store.event(a.task, a.version, "train", start, end)
        t.commits.append(end)
        if self.options.on_step is not None:
            # Committed already: a listener's failure must not undo the step.
            self._quietly(self.options.on_step, record, stats)
        return TrainDone(a.task, new, train_s=record["train_s"])

    def _train_examples(self, a: StartTrain, t: TaskRun, start: float) -> TrainDone:
        """A step of a task that needs no rollout (SFT, DPO): its next examples,
        scored on validation examples after the step (all of them after the
        last)."""
        self.store.event(a.task, a.version, "queue", t.ready_at, start)
        batch = t.data.next_batch(t.batch_size)
        last = a.version + 1 >= t.total_steps
        valid = None
        if last and t.valid_full:
            valid = t.valid_full
        elif t.valid is not None:
            valid = t.valid.next_batch(min(t.batch_size, len(t.valid.rows)))
        result = self.trainer.train_task(a.task, batch, valid)
        new = self._committed(a, result)
        end = time.time()
        record: StepRecord = {
            "task": a.task,
            "version": new,
            "reward_mean": None,
            "staleness_max": 0,
            "n_trajectories": len(batch),
            "trained_tokens": sum(int(ex["loss_mask"].sum()) for ex in batch),
            "rollout_s": 0.0,
            "queue_wait_s": start - t.ready_at,
            "trainer": a.trainer,
            "train_s": end - start,
            "t_commit": end,
            "loss": result["loss"],
            "grad_norm": result["grad_norm"],
            **result["audit"],
            **result["process"],
        }
        full = valid is not None and valid is t.valid_full
        for part, scores in _FULL_VALID.items():
            got = result.get(part)
            if got is None:
                continue
            if full:  # this step's validation covered every example
                for name in scores:
                    got[f"full_valid_{name}"] = got.get(f"valid_{name}")
            record[part] = got
        placement = result.get("placement")
        if placement is not None:
            record["cores_mean"] = placement["cores_mean"]
            record["borrowed_s"] = placement["borrowed_s"]
        return self._record(a, t, record, result["stats"], start)

    def _save(self, task: str, version: int, folder: str) -> None:
        """Write version ``version``'s adapter and optimizer state, retrying a
        failed write in place: the engine already holds that version, so the
        phase retry (a new batch at the old version) would be refused as stale."""
        retries = self.options.save_retries
        for attempt in range(retries + 1):
            try:
                self.trainer.save_adapter(task, folder)
                self.trainer.save_task_state(task, folder)
                return
            except Exception as e:
                if attempt == retries:
                    raise RuntimeError(
                        f"saving v{version} to {folder} failed "
                        f"{attempt + 1}x (fault.save_retries={retries}): "
                        f"{type(e).__name__}: {e}"
                    ) from e
                wait = min(2.0**attempt, 10.0)
                logger.warning(
                    f"task {task}: saving v{version} failed ({type(e).__name__}: "
                    f"{e}); retrying in {wait:.0f} s"
                )
                time.sleep(wait)

    def _publish(self, a: StartPublish) -> PublishDone:
        start = time.time()
        self.rollout.publish(
            a.task, a.version, str(self.store.adapter_dir(a.task, a.version))
        )
        t = self.tasks[a.task]
        t.ready_at = time.time()
        self.store.event(a.task, a.version, "publish", start, t.ready_at)
        if self.options.on_publish is not None:
            self._quietly(self.options.on_publish, a.task, a.version)
        # Bounded retention: the newest K commits, never the one now served.
        self.store.retain_adapters(a.task, self.options.keep_adapters, served=a.version)
        return PublishDone(a.task, a.version, publish_s=t.ready_at - start)

    def _eval(self, a: StartEval) -> None:
        """Evaluate ``a.version``; whatever happens, the core hears it returned
        (an eval never fails its task)."""
        t, start = self.tasks[a.task], time.time()
        try:
            record, samples = run_eval(
                self.rollout, t, a.version, self.options.rollout_timeout
            )
        except Exception as e:
            why = f"{type(e).__name__}: {e}"
            logger.error(f"task {a.task} eval of v{a.version} failed: {why}")
            record, samples = failed_eval(t, a.version, start, why), []
        t.evals.append((a.version, record["reward_mean"]))
        try:
            self.store.event(a.task, a.version, "eval", record["start"], record["end"])
            self.store.eval(record, samples)
            if self.options.on_eval is not None:
                self._quietly(self.options.on_eval, record, samples)
        finally:
            self.events.put(EvalDone(a.task, a.version))

    # -- report -----------------------------------------------------------------
    def summary(self, wall: float) -> dict[str, Any]:
        return summarize(self, wall)
