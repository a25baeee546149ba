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


@dataclass
class TaskState:
    name: str
    total_steps: int
    version: int = 0
    steps_done: int = 0
    phase: Phase = Phase.PENDING
    reason: str = ""


@dataclass
class SchedulerCore:
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
            task.phase = Phase.QUEUED
            self.train_queue.append(task.name)
            return self._next_train()
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
        task = TaskState(event.task, event.total_steps, version=event.version)
        task.steps_done = event.version  # one committed version per step
        self.tasks[event.task] = task
        return self._after_publish(task)

    def _after_publish(self, task: TaskState) -> list[Action]:
        if task.steps_done >= task.total_steps:
            task.phase = Phase.DONE
            return [FinishTask(task.name)]
        task.phase = Phase.ROLLOUT
        return [StartRollout(task.name, task.version)]

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
        task.phase = Phase.FAILED
        task.reason = reason
        actions: list[Action] = [FinishTask(task.name, failed=True)]
        if was_training:
            self.training = None
            actions += self._next_train()
        return actions

    @staticmethod
    def _expect(task: TaskState, phase: Phase, version: int) -> None:
        if task.phase is not phase or version != task.version:
            raise ProtocolError(
                f"task {task.name!r}: got {phase.value} v{version} while in "
                f"{task.phase.value} at v{task.version}"
            )
