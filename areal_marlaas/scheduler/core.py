"""The MARLaaS scheduling core: a pure state machine (events in, actions out).

It knows nothing of threads, HTTP or tensors; the runtime drives it with real
rollouts and training, and a simulator can drive it with modelled latencies.

Async (MARLaaS) mode: every task loops
``rollout(v) -> queue -> train -> publish(v+1) -> rollout(v+1)``, independently of
the others; tasks meet only in the FIFO training queue, which feeds one trainer.
A task has at most one batch in flight and never rolls out before its previous
version is published, so staleness is zero by construction.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum


class Phase(StrEnum):
    PENDING = "pending"  # submitted, not yet rolling out
    ROLLOUT = "rollout"
    QUEUED = "queued"  # batch ready, waiting for the trainer
    TRAIN = "train"
    PUBLISH = "publish"
    DONE = "done"
    FAILED = "failed"


# -- events (runtime -> core) ---------------------------------------------------
@dataclass(frozen=True)
class Submitted:
    task: str
    total_steps: int
    version: int = 0  # resume starts from the committed version
    kv_bytes: int = 0  # KV footprint of one rollout batch (admission)
    priority: int = 0  # higher is admitted first


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
class TaskFailed:
    task: str
    reason: str


Event = Submitted | RolloutDone | TrainDone | PublishDone | TaskFailed


# -- actions (core -> runtime) --------------------------------------------------
@dataclass(frozen=True)
class StartRollout:
    task: str
    version: int


@dataclass(frozen=True)
class StartTrain:
    task: str
    version: int  # the version the batch was generated with


@dataclass(frozen=True)
class StartPublish:
    task: str
    version: int


@dataclass(frozen=True)
class FinishTask:
    task: str
    failed: bool = False


Action = StartRollout | StartTrain | StartPublish | FinishTask


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
    phase: Phase = Phase.PENDING
    reason: str = ""
    kv_bytes: int = 0
    priority: int = 0
    order: int = 0


@dataclass
class SchedulerCore:
    """``kv_budget`` (bytes, None = unlimited) caps the summed KV footprint of the
    tasks rolling out at once; waiting tasks are admitted by priority, then
    submission order, and a task that does not fit holds back those behind it
    (no overtaking, so a large task is never starved)."""

    kv_budget: int | None = None
    tasks: dict[str, TaskState] = field(default_factory=dict)
    train_queue: deque[str] = field(default_factory=deque)
    training: str | None = None

    # -- queries ----------------------------------------------------------------
    def finished(self) -> bool:
        return bool(self.tasks) and all(
            t.phase in (Phase.DONE, Phase.FAILED) for t in self.tasks.values()
        )

    def rolling(self) -> list[str]:
        return [n for n, t in self.tasks.items() if t.phase is Phase.ROLLOUT]

    def kv_in_use(self) -> int:
        return sum(self.tasks[n].kv_bytes for n in self.rolling())

    # -- transitions ------------------------------------------------------------
    def handle(self, event: Event) -> list[Action]:
        if isinstance(event, Submitted):
            return self._submitted(event)
        task = self.tasks.get(event.task)
        if task is None:
            raise ProtocolError(f"event for unknown task: {event}")
        if isinstance(event, TaskFailed):
            return self._failed(task, event.reason)
        if task.phase in (Phase.DONE, Phase.FAILED):
            return []  # late news about a task that already ended
        if isinstance(event, RolloutDone):
            self._expect(task, Phase.ROLLOUT, event.version)
            task.phase = Phase.QUEUED  # its KV is free again
            self.train_queue.append(task.name)
            return [*self._next_train(), *self._admit()]
        if isinstance(event, TrainDone):
            if self.training != task.name or event.version != task.version + 1:
                raise ProtocolError(f"{event} while training {self.training!r}")
            self.training = None
            task.version = event.version
            task.steps_done += 1
            task.phase = Phase.PUBLISH
            return [StartPublish(task.name, task.version), *self._next_train()]
        if isinstance(event, PublishDone):
            self._expect(task, Phase.PUBLISH, event.version)
            return self._after_publish(task)
        raise ProtocolError(f"unknown event {event!r}")

    def _submitted(self, event: Submitted) -> list[Action]:
        if event.task in self.tasks:
            raise ProtocolError(f"task {event.task!r} submitted twice")
        if self.kv_budget is not None and event.kv_bytes > self.kv_budget:
            raise AdmissionError(
                f"task {event.task!r}: one rollout batch needs {event.kv_bytes} bytes "
                f"of KV cache but the budget is {self.kv_budget}; it could never be "
                "admitted (lower batch_size, n_samples or max_new_tokens)"
            )
        task = TaskState(
            event.task,
            event.total_steps,
            version=event.version,
            kv_bytes=event.kv_bytes,
            priority=event.priority,
            order=len(self.tasks),
        )
        task.steps_done = event.version  # one committed version per step
        self.tasks[event.task] = task
        return self._after_publish(task)

    def _after_publish(self, task: TaskState) -> list[Action]:
        if task.steps_done >= task.total_steps:
            task.phase = Phase.DONE
            return [FinishTask(task.name)]
        task.phase = Phase.PENDING
        return self._admit()

    def _admit(self) -> list[Action]:
        waiting = sorted(
            (t for t in self.tasks.values() if t.phase is Phase.PENDING),
            key=lambda t: (-t.priority, t.order),
        )
        used = self.kv_in_use()
        actions: list[Action] = []
        for task in waiting:
            if self.kv_budget is not None and used + task.kv_bytes > self.kv_budget:
                break
            used += task.kv_bytes
            task.phase = Phase.ROLLOUT
            actions.append(StartRollout(task.name, task.version))
        return actions

    def _next_train(self) -> list[Action]:
        if self.training is not None or not self.train_queue:
            return []
        name = self.train_queue.popleft()
        task = self.tasks[name]
        task.phase = Phase.TRAIN
        self.training = name
        return [StartTrain(name, task.version)]

    def _failed(self, task: TaskState, reason: str) -> list[Action]:
        if task.phase in (Phase.DONE, Phase.FAILED):
            return []
        was_training = self.training == task.name
        if task.name in self.train_queue:
            self.train_queue.remove(task.name)
        task.phase = Phase.FAILED  # frees its KV if it was rolling out
        task.reason = reason
        actions: list[Action] = [FinishTask(task.name, failed=True)]
        if was_training:
            self.training = None
            actions += self._next_train()
        return [*actions, *self._admit()]

    @staticmethod
    def _expect(task: TaskState, phase: Phase, version: int) -> None:
        if task.phase is not phase or version != task.version:
            raise ProtocolError(
                f"task {task.name!r}: got {phase.value} v{version} while in "
                f"{task.phase.value} at v{task.version}"
            )
