"""What the runtime needs of the rollout side and of the trainers: every method
and attribute it uses, so a backend (or a test's stand-in) that has these runs
under it, and the runtime never probes for optional ones.

``RolloutBackend`` (``rollout.engine.MultiLoRAvLLMEngine``, its controller, or
either behind ``rollout.supervisor.SupervisedRollout``):

* ``rollout_task(rows, workflow, workflow_kwargs, group_size, timeout)``: called
  on a worker thread when the core starts a task's rollout (``StartRollout``);
  returns one result per episode (``rows`` x ``group_size``), a failed episode
  as ``None`` or a failure record (``trajectory.failure``). Raising fails the
  phase (the core retries it at the same version or fails the task).
* ``publish(task, version, path)``: called on a worker thread after a step is
  committed (``StartPublish``): make the adapter in ``path`` the one served as
  the task's ``version``; returns once requests get it. Raising retries it.
* ``remove_task(task)``: called on a worker thread once a task has ended, with
  ``RuntimeOptions.release_finished`` (the job service): drop its adapter from
  the server. Errors are logged, never raised into the runtime.
* ``set_priority(task, priority)``: called on a worker thread right before the
  task's ``rollout_task`` (``StartRollout.priority``): the server priority of
  its requests from then on, its evals' included (lower is served first; 0
  unless ``scheduler.rollout_order=fair``).

``TrainBackend`` (``train.pool.TrainerPool``: one or more trainer engines, each
task placed on one; a pool of one engine holds every task):

* ``count``: how many trainers; read once, when the runtime is built (one
  training thread each, and the core's number of train slots).
* ``place(task)``: called by the job service before it adds a task's state to a
  trainer (``Runtime.place``); returns the trainer index that holds (or will
  hold) the task, placing it if it is new. ``unplace(task)`` undoes it for a
  task whose set-up failed.
* ``trainer_of(task)``: called when a task is submitted to the core; returns the
  trainer holding its weights and optimizer state, or None (any trainer).
* ``train_task(task, batch, valid)``: called on that trainer's thread
  (``StartTrain``); runs one step by the task's method and returns its
  ``StepResult`` (the committed version, the loss, stats, audit, ...). A
  supervised task's ``batch`` is its tokenized examples and ``valid``, when
  given, examples it is scored on after the step.
* ``release_batch(batch)``: called right after ``train_task``: free what the
  batch holds (a pool frees it inside ``train_task`` and makes this a no-op).
* ``save_adapter(task, path)`` / ``save_task_state(task, path)``: called on the
  trainer's thread after each step, to write the committed version's adapter
  and optimizer state; a failure is retried in place.
* ``remove_task(task)``: called on the task's trainer thread once it has ended,
  with ``release_finished``: drop its weights, optimizer and placement.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

from areal_marlaas.rundir.records import StepResult


class TaskStatus(StrEnum):
    """What the runtime tells its ``on_status`` listener about a task."""

    RUNNING = "running"  # its first rollout started
    HELD = "held"  # admission holds its rollout (the reason says why)
    PAUSED = "paused"  # stopped after a committed, published step
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


@runtime_checkable
class RolloutBackend(Protocol):
    def rollout_task(
        self, rows, workflow, workflow_kwargs=None, group_size=1, timeout=None
    ) -> list[dict[str, Any] | None]: ...

    def publish(self, task: str, version: int, path: str) -> Any: ...

    def remove_task(self, task: str) -> None: ...

    def set_priority(self, task: str, priority: int) -> None: ...


@runtime_checkable
class TrainBackend(Protocol):
    # Positional-only: the runtime passes them so, and the pool names them `name`.
    @property
    def count(self) -> int: ...

    def place(self, task: str, /) -> int: ...

    def unplace(self, task: str, /) -> None: ...

    def trainer_of(self, task: str, /) -> int | None: ...

    def train_task(
        self,
        task: str,
        batch: list[dict[str, Any]],
        valid: list[dict[str, Any]] | None = None,
        /,
    ) -> StepResult: ...

    def release_batch(self, batch: list[dict[str, Any]], /) -> None: ...

    def save_adapter(self, task: str, path: str, /) -> Any: ...

    def save_task_state(self, task: str, path: str, /) -> Any: ...

    def remove_task(self, task: str, /) -> None: ...
