"""The MARLaaS scheduling core: a pure state machine (events in, actions out).

It knows nothing of threads, HTTP or tensors; the runtime drives it with real
rollouts and training, and the simulator drives it with modelled latencies.

Every mode keeps each task strictly on-policy: a task has at most one batch in
flight and never rolls out before its previous version is published. The modes
differ only in *when* a task may start a rollout or a training step:

* ``async`` (MARLaaS): every task loops
  ``rollout(v) -> queue -> train -> publish(v+1) -> rollout(v+1)`` on its own; tasks
  meet only in the FIFO training queue.
* ``sync`` (multi-LoRA synchronous): rounds. All tasks roll out version ``v``;
  training starts when the round's last rollout is done (barrier); each trains in
  turn; round ``v+1`` starts when every task has published (barrier). A task that
  arrives (or resumes) behind the others runs its earlier rounds alone until it
  catches up; the others' next round waits for it.
* ``sequential`` / ``collocated`` (single-task baselines): one task at a time runs
  all its steps; they differ only in placement, which the runtime sets.

Tasks may also arrive, pause, resume and be cancelled while others run (the job
service): ``Submitted`` at any time; ``Pause`` stops a task after its current
step is committed and published; ``Resume`` lets it roll out again; ``Cancel``
ends it at once when nothing of it is in flight, else when its phase returns.

Training order: ``fifo`` (default) trains batches in the order their rollouts
finished. ``first_steps`` trains a task's first batch since it was submitted
ahead of the others (FIFO within each class): a tenant who just arrived waits
for at most the batch in training and the other newcomers' first batches, not
for every running task's next step. Each task jumps the queue once, so no batch
waits behind more than one first batch per task.

Trainers: ``trainers`` steps may run at once, one per trainer. A task submitted
with a ``trainer`` trains only there (that trainer holds its weights and optimizer
state); a free trainer takes the first batch in the queue's order that may run on
it, so a batch whose trainer is busy lets the next one through to a free trainer.
A task has one batch at a time, so its steps stay in version order.

Admission: a task starts a rollout only while the KV footprint of the tasks rolling
out (or the server's reported usage, whichever is larger) plus its own stays within
``kv_budget``, and fewer than ``max_rolling`` tasks roll out. Waiting tasks go by
priority, then submission order, and a task that does not fit holds back those
behind it (no overtaking, so a large task is never starved).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum

MODES = ("async", "sync", "sequential", "collocated")
TRAIN_ORDERS = ("fifo", "first_steps")


class Phase(StrEnum):
    PENDING = "pending"  # waiting to roll out its current version
    ROLLOUT = "rollout"
    QUEUED = "queued"  # batch ready, waiting for a trainer
    TRAIN = "train"
    PUBLISH = "publish"
    PAUSED = "paused"  # stopped after a committed, published version
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


_ENDED = (Phase.DONE, Phase.FAILED, Phase.CANCELLED)


# -- events (runtime -> core) ---------------------------------------------------
@dataclass(frozen=True)
class Submitted:
    task: str
    total_steps: int
    version: int = 0  # resume starts from the committed version
    kv_bytes: int = 0  # KV footprint of one rollout batch (admission)
    priority: int = 0  # higher is admitted first
    # The trainer holding the task's weights and optimizer state: its steps run
    # there only. None: any free trainer (state that moves with the batch).
    trainer: int | None = None


@dataclass(frozen=True)
class RolloutDone:
    task: str
    version: int


@dataclass(frozen=True)
class TrainDone:
    task: str
    version: int  # the new, committed version


@dataclass(frozen=True)
class PublishDone:
    task: str
    version: int


@dataclass(frozen=True)
class TaskError:
    """The task's phase in flight failed; the core retries it or fails the task."""

    task: str
    reason: str


@dataclass(frozen=True)
class TaskFailed:
    """Fail the task now, without retry."""

    task: str
    reason: str


@dataclass(frozen=True)
class KVUsage:
    """KV bytes the server reports in use (``vllm:kv_cache_usage_perc``)."""

    used_bytes: int


@dataclass(frozen=True)
class Cancel:
    """End the task: now if nothing of it is in flight, else when it returns."""

    task: str
    reason: str = "cancelled"


@dataclass(frozen=True)
class Pause:
    """Stop the task after its current step is committed and published."""

    task: str


@dataclass(frozen=True)
class Resume:
    """Let a paused task roll out again (or withdraw a pause not yet reached)."""

    task: str


Event = (
    Submitted
    | RolloutDone
    | TrainDone
    | PublishDone
    | TaskError
    | TaskFailed
    | KVUsage
    | Cancel
    | Pause
    | Resume
)


# -- actions (core -> runtime) --------------------------------------------------
@dataclass(frozen=True)
class StartRollout:
    task: str
    version: int


@dataclass(frozen=True)
class StartTrain:
    task: str
    version: int  # the version the batch was generated with
    trainer: int = 0  # which trainer runs the step


@dataclass(frozen=True)
class StartPublish:
    task: str
    version: int


@dataclass(frozen=True)
class FinishTask:
    task: str
    failed: bool = False
    reason: str = ""
    cancelled: bool = False


@dataclass(frozen=True)
class TaskPaused:
    """The task stopped at ``version`` (committed and published) until resumed."""

    task: str
    version: int


@dataclass(frozen=True)
class HoldRollout:
    """A task ready to roll out must wait; emitted once per wait. ``reason``:
    ``kv`` (budget), ``cap`` (max_rolling), ``barrier`` (sync round) or ``turn``
    (single-task modes)."""

    task: str
    version: int
    reason: str


Action = (
    StartRollout | StartTrain | StartPublish | FinishTask | HoldRollout | TaskPaused
)


class ProtocolError(RuntimeError):
    """An event that cannot happen in the task's current phase (a runtime bug)."""


class AdmissionError(ValueError):
    """A task whose rollout batch alone exceeds the KV budget: it could never run."""


@dataclass
class TaskState:
    name: str
    total_steps: int
    version: int = 0
    steps_done: int = 0
    start_version: int = 0  # the version it was submitted at
    phase: Phase = Phase.PENDING
    reason: str = ""
    kv_bytes: int = 0
    priority: int = 0
    order: int = 0
    errors: int = 0  # failures at the current version (reset by a commit)
    held: str = ""  # why it is waiting, once a HoldRollout was emitted
    stop: str = ""  # "pause" or "cancel", asked while a phase was in flight
    trainer: int | None = None  # see Submitted.trainer

    @property
    def active(self) -> bool:
        return self.phase not in _ENDED


@dataclass
class SchedulerCore:
    mode: str = "async"
    kv_budget: int | None = None  # bytes; None = unlimited
    max_rolling: int | None = None  # tasks rolling out at once; None = unlimited
    trainers: int = 1  # trainers fed by the one queue
    task_retries: int = 0  # retries of a failed phase per version
    train_order: str = "fifo"  # or "first_steps" (see the module docstring)
    tasks: dict[str, TaskState] = field(default_factory=dict)
    train_queue: deque[str] = field(default_factory=deque)
    training: dict[str, int] = field(default_factory=dict)  # task -> trainer
    live_kv: int = 0  # what the server last reported in use

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(
                f"scheduler mode must be one of {MODES}, got {self.mode!r}"
            )
        if self.train_order not in TRAIN_ORDERS:
            raise ValueError(
                f"train_order must be one of {TRAIN_ORDERS}, got {self.train_order!r}"
            )
        if self.trainers < 1:
            raise ValueError(f"trainers must be >= 1, got {self.trainers}")
        if self.max_rolling is not None and self.max_rolling < 1:
            raise ValueError(f"max_rolling must be >= 1, got {self.max_rolling}")

    # -- queries ----------------------------------------------------------------
    def finished(self) -> bool:
        return bool(self.tasks) and not any(t.active for t in self.tasks.values())

    def rolling(self) -> list[str]:
        return [n for n, t in self.tasks.items() if t.phase is Phase.ROLLOUT]

    def kv_in_use(self) -> int:
        """Estimated KV of the batches rolling out now."""
        return sum(self.tasks[n].kv_bytes for n in self.rolling())

    def kv_used(self) -> int:
        """What admission counts as used: the estimate or the server's report."""
        return max(self.kv_in_use(), self.live_kv)

    def _active(self) -> list[TaskState]:
        """Tasks the modes' turns and barriers wait for (a paused task is left
        out until it resumes)."""
        return [
            t for t in self.tasks.values() if t.active and t.phase is not Phase.PAUSED
        ]

    # -- transitions ------------------------------------------------------------
    def handle(self, event: Event) -> list[Action]:
        if isinstance(event, Submitted):
            return self._submitted(event)
        if isinstance(event, KVUsage):
            self.live_kv = max(0, int(event.used_bytes))
            return self._admit()
        task = self.tasks.get(event.task)
        if task is None:
            raise ProtocolError(f"event for unknown task: {event}")
        if not task.active:
            return []  # late news about a task that already ended
        if isinstance(event, Cancel | Pause | Resume):
            return self._control(task, event)
        if isinstance(event, TaskFailed):
            return self._fail(task, event.reason)
        if isinstance(event, TaskError):
            if task.stop == "cancel":
                return self._cancel(task)
            return self._error(task, event.reason)
        if isinstance(event, RolloutDone):
            self._expect(task, Phase.ROLLOUT, event.version)
            if task.stop == "cancel":
                return self._cancel(task)
            task.phase = Phase.QUEUED  # its KV is free again
            self.train_queue.append(task.name)
            return [*self._next_train(), *self._admit()]
        if isinstance(event, TrainDone):
            if task.name not in self.training or event.version != task.version + 1:
                raise ProtocolError(f"{event} while training {sorted(self.training)}")
            del self.training[task.name]
            task.version = event.version
            task.steps_done += 1
            task.errors = 0
            if task.stop == "cancel":  # committed, but never served again
                return [*self._cancel(task), *self._next_train()]
            task.phase = Phase.PUBLISH
            return [StartPublish(task.name, task.version), *self._next_train()]
        if isinstance(event, PublishDone):
            self._expect(task, Phase.PUBLISH, event.version)
            return self._after_publish(task)
        raise ProtocolError(f"unknown event {event!r}")

    def _submitted(self, event: Submitted) -> list[Action]:
        if event.task in self.tasks:
            raise ProtocolError(f"task {event.task!r} submitted twice")
        if event.trainer is not None and not 0 <= event.trainer < self.trainers:
            raise ProtocolError(
                f"task {event.task!r} placed on trainer {event.trainer}, but there "
                f"are {self.trainers}"
            )
        if self.kv_budget is not None and event.kv_bytes > self.kv_budget:
            raise AdmissionError(
                f"task {event.task!r}: one rollout batch needs "
                f"{event.kv_bytes / 2**20:.1f} MiB of KV cache but the budget is "
                f"{self.kv_budget / 2**20:.1f} MiB; it could never be admitted "
                "(lower batch_size, n_samples or max_new_tokens, or raise the budget)"
            )
        task = TaskState(
            event.task,
            event.total_steps,
            version=event.version,
            start_version=event.version,
            kv_bytes=event.kv_bytes,
            priority=event.priority,
            order=len(self.tasks),
            trainer=event.trainer,
        )
        task.steps_done = event.version  # one committed version per step
        self.tasks[event.task] = task
        return self._after_publish(task)

    def _after_publish(self, task: TaskState) -> list[Action]:
        actions: list[Action] = []
        if task.steps_done >= task.total_steps:
            task.phase = Phase.DONE
            actions.append(FinishTask(task.name))
            # A finished task can release a sync barrier or a single-task turn.
            actions += self._next_train()
        elif task.stop == "cancel":
            return self._cancel(task)
        elif task.stop == "pause":
            return self._pause_now(task)
        else:
            task.phase = Phase.PENDING
        return [*actions, *self._admit()]

    # -- control (pause, resume, cancel) ----------------------------------------
    def _control(self, task: TaskState, event: Cancel | Pause | Resume) -> list[Action]:
        idle = task.phase in (Phase.PENDING, Phase.PAUSED, Phase.QUEUED)
        if isinstance(event, Cancel):
            task.reason = event.reason
            if idle:
                return self._cancel(task)
            task.stop = "cancel"
            return []
        if isinstance(event, Pause):
            if task.phase is Phase.PENDING:
                return self._pause_now(task)
            if task.phase is not Phase.PAUSED and task.stop != "cancel":
                task.stop = "pause"
            return []
        # Resume
        if task.stop == "pause":
            task.stop = ""
        if task.phase is Phase.PAUSED:
            task.phase = Phase.PENDING
            task.held = ""
            return self._admit()
        return []

    def _pause_now(self, task: TaskState) -> list[Action]:
        task.stop = ""
        task.phase = Phase.PAUSED
        # A paused task can release a sync barrier or a single-task turn.
        return [
            TaskPaused(task.name, task.version),
            *self._next_train(),
            *self._admit(),
        ]

    def _cancel(self, task: TaskState) -> list[Action]:
        self._drop_batch(task)
        task.phase = Phase.CANCELLED  # frees its KV and train slot
        task.stop = ""
        return [
            FinishTask(task.name, reason=task.reason or "cancelled", cancelled=True),
            *self._next_train(),
            *self._admit(),
        ]

    # -- admission --------------------------------------------------------------
    def _turn(self, task: TaskState) -> bool:
        """Whether the mode lets ``task`` roll out now (resources aside)."""
        if self.mode == "async":
            return True
        if self.mode == "sync":
            # Round v starts when every task has committed and published v.
            return all(
                u.version >= task.version
                and not (u.version == task.version and u.phase is Phase.PUBLISH)
                for u in self._active()
            )
        first = min(self._active(), key=lambda t: (-t.priority, t.order))
        return first is task

    def _admit(self) -> list[Action]:
        waiting = sorted(
            (t for t in self.tasks.values() if t.phase is Phase.PENDING),
            key=lambda t: (-t.priority, t.order),
        )
        used = self.kv_used()
        rolling = len(self.rolling())
        actions: list[Action] = []
        blocked = ""  # a resource hold: nobody behind may overtake
        for task in waiting:
            reason = blocked
            if not reason and not self._turn(task):
                reason = "barrier" if self.mode == "sync" else "turn"
            elif not reason and self.max_rolling is not None:
                if rolling >= self.max_rolling:
                    reason = blocked = "cap"
            if not reason and self.kv_budget is not None:
                if used + task.kv_bytes > self.kv_budget:
                    reason = blocked = "kv"
            if reason:
                if task.held != reason:
                    task.held = reason
                    actions.append(HoldRollout(task.name, task.version, reason))
                continue
            used += task.kv_bytes
            rolling += 1
            task.held = ""
            task.phase = Phase.ROLLOUT
            actions.append(StartRollout(task.name, task.version))
        return actions

    # -- training ---------------------------------------------------------------
    def _may_train(self, task: TaskState) -> bool:
        if self.mode != "sync":
            return True
        # Training of round v waits for every rollout of round v.
        return not any(
            u.version == task.version and u.phase in (Phase.PENDING, Phase.ROLLOUT)
            for u in self._active()
        )

    def _next_train(self) -> list[Action]:
        actions: list[Action] = []
        free = [i for i in range(self.trainers) if i not in self.training.values()]
        if not free or not self.train_queue:
            return actions
        for name in self._queue_order():
            if not free:
                break
            task = self.tasks[name]
            if not self._may_train(task):
                # Its round is still rolling out. A batch of an earlier round (a
                # task that arrived or resumed late) may go: the round's barrier
                # waits for that task, so holding it would deadlock.
                continue
            slot = free[0] if task.trainer is None else task.trainer
            if slot not in free:
                continue  # its trainer is busy; a batch for a free one may go
            free.remove(slot)
            self.train_queue.remove(task.name)
            task.phase = Phase.TRAIN
            self.training[task.name] = slot
            actions.append(StartTrain(task.name, task.version, slot))
        return actions

    def _queue_order(self) -> list[str]:
        """The queue in the order trainers take it (see the module docstring)."""
        if self.train_order != "first_steps":
            return list(self.train_queue)
        first, rest = [], []
        for name in self.train_queue:
            task = self.tasks[name]
            (first if task.version == task.start_version else rest).append(name)
        return first + rest

    # -- failures ---------------------------------------------------------------
    def _error(self, task: TaskState, reason: str) -> list[Action]:
        task.errors += 1
        task.reason = reason
        if task.errors > self.task_retries:
            return self._fail(
                task, f"{reason} (failed {task.errors}x at v{task.version})"
            )
        if task.phase is Phase.PUBLISH:
            return [StartPublish(task.name, task.version)]
        if task.phase is Phase.PENDING:
            raise ProtocolError(f"task {task.name!r}: error while nothing in flight")
        # A failed rollout or training step: generate a fresh batch at the same
        # version (the failed batch is dropped, so the task stays on-policy).
        self._drop_batch(task)
        if task.stop == "pause":
            return self._pause_now(task)
        task.phase = Phase.PENDING
        return [*self._next_train(), *self._admit()]

    def _drop_batch(self, task: TaskState) -> None:
        if task.name in self.train_queue:
            self.train_queue.remove(task.name)
        self.training.pop(task.name, None)

    def _fail(self, task: TaskState, reason: str) -> list[Action]:
        self._drop_batch(task)
        task.phase = Phase.FAILED  # frees its KV and train slot
        task.reason = reason
        return [
            FinishTask(task.name, failed=True, reason=reason),
            *self._next_train(),
            *self._admit(),
        ]

    @staticmethod
    def _expect(task: TaskState, phase: Phase, version: int) -> None:
        if task.phase is not phase or version != task.version:
            raise ProtocolError(
                f"task {task.name!r}: got {phase.value} v{version} while in "
                f"{task.phase.value} at v{task.version}"
            )
