"""The runtime that drives the scheduling core with real rollouts and training.

One dispatcher loop owns the core: it takes events from a queue, feeds them to the
core and starts the actions the core returns. Rollouts and publishes run on a
thread pool (one task never has two in flight, so the pool needs one thread per
task); training runs on a single thread, which is the serialized FIFO trainer.
"""

from __future__ import annotations

import queue
import statistics
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from areal.utils import logging

from areal_marlaas.manager.data import TaskData
from areal_marlaas.manager.store import RunStore
from areal_marlaas.scheduler.core import (
    Action,
    FinishTask,
    PublishDone,
    RolloutDone,
    SchedulerCore,
    StartPublish,
    StartRollout,
    StartTrain,
    Submitted,
    TaskFailed,
    TrainDone,
)

logger = logging.getLogger("MARLaaSRuntime")


class RolloutBackend(Protocol):
    def publish(self, task: str, version: int, path: str) -> Any: ...

    def rollout_task(
        self, rows, workflow, workflow_kwargs=None, group_size=1, timeout=None
    ) -> list[dict[str, Any] | None]: ...


class TrainBackend(Protocol):
    def train_task(self, task: str, batch: list[dict[str, Any]]) -> dict: ...

    def save_adapter(self, task: str, path: str) -> Any: ...

    def release_batch(self, batch: list[dict[str, Any]]) -> None: ...


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
    # filled while running
    submitted_at: float = 0.0
    rollout_end: float = 0.0
    batch: list[dict[str, Any]] | None = None
    rewards: list[float] = field(default_factory=list)
    commits: list[float] = field(default_factory=list)
    error: str = ""


def _tensor(x) -> torch.Tensor:
    """Plain tensor from a tensor or an AReaL RTensor (single-controller mode)."""
    if torch.is_tensor(x):
        return x
    from areal.infra.rpc.rtensor import RTensor

    return RTensor.localize(x)


class Runtime:
    def __init__(
        self,
        tasks: list[TaskRun],
        rollout: RolloutBackend,
        trainer: TrainBackend,
        store: RunStore,
        mode: str = "async",
        rollout_timeout: float | None = None,
        on_step: Callable[[dict[str, Any], dict[str, float]], None] | None = None,
    ):
        if mode != "async":
            raise ValueError(f"scheduler mode {mode!r} is not implemented yet")
        self.tasks = {t.name: t for t in tasks}
        self.rollout = rollout
        self.trainer = trainer
        self.store = store
        self.mode = mode
        self.rollout_timeout = rollout_timeout
        self.on_step = on_step
        self.core = SchedulerCore()
        self.events: queue.Queue = queue.Queue()
        self._workers = ThreadPoolExecutor(len(tasks) + 1, "marlaas-task")
        self._trainer = ThreadPoolExecutor(1, "marlaas-trainer")
        self.started_at = 0.0

    # -- loop -------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        self.started_at = time.time()
        for t in self.tasks.values():
            t.submitted_at = time.time()
            self.events.put(Submitted(t.name, t.total_steps, t.start_version))
        try:
            while not self.core.finished():
                event = self.events.get()
                for action in self.core.handle(event):
                    self._dispatch(action)
        finally:
            self._workers.shutdown(wait=True)
            self._trainer.shutdown(wait=True)
        return self.summary(time.time() - self.started_at)

    def _dispatch(self, action: Action) -> None:
        if isinstance(action, StartRollout):
            self._workers.submit(self._guard, action.task, self._rollout, action)
        elif isinstance(action, StartTrain):
            self._trainer.submit(self._guard, action.task, self._train, action)
        elif isinstance(action, StartPublish):
            self._workers.submit(self._guard, action.task, self._publish, action)
        elif isinstance(action, FinishTask):
            state = "failed" if action.failed else "done"
            logger.info(f"task {action.task} {state}")

    def _guard(self, task: str, fn, action) -> None:
        try:
            self.events.put(fn(action))
        except Exception as e:  # one tenant's failure never stops the others
            reason = f"{type(e).__name__}: {e}"
            logger.error(f"task {task} failed: {reason}\n{traceback.format_exc()}")
            self.tasks[task].error = reason
            self.events.put(TaskFailed(task, reason))

    # -- phases -----------------------------------------------------------------
    def _rollout(self, a: StartRollout) -> RolloutDone:
        t = self.tasks[a.task]
        start = time.time()
        rows = t.data.next_batch(t.batch_size)
        trajs = self.rollout.rollout_task(
            rows, t.workflow, t.workflow_kwargs, t.n_samples, self.rollout_timeout
        )
        ok = [x for x in trajs if x is not None]
        if not ok:
            raise RuntimeError(f"all {len(trajs)} rollouts of v{a.version} failed")
        t.batch = ok
        t.rollout_end = time.time()
        self.store.event(a.task, a.version, "rollout", start, t.rollout_end)
        return RolloutDone(a.task, a.version)

    def _train(self, a: StartTrain) -> TrainDone:
        t = self.tasks[a.task]
        start = time.time()
        self.store.event(a.task, a.version, "queue", t.rollout_end, start)
        batch, t.batch = t.batch, None
        rewards = torch.cat([_tensor(x["rewards"]).flatten() for x in batch])
        staleness = max(
            a.version
            - int(_tensor(x["versions"])[_tensor(x["loss_mask"]).bool()].min())
            for x in batch
        )
        stats = self.trainer.train_task(a.task, batch)
        self.trainer.release_batch(batch)
        new = a.version + 1
        self.trainer.save_adapter(a.task, str(self.store.adapter_dir(a.task, new)))
        self.store.commit(a.task, new, {"cursor": t.data.cursor, "steps": new})
        end = time.time()
        self.store.event(a.task, a.version, "train", start, end)
        t.commits.append(end)
        t.rewards.append(float(rewards.mean()))
        record = {
            "task": a.task,
            "version": new,
            "reward_mean": float(rewards.mean()),
            "staleness_max": staleness,
            "n_trajectories": int(rewards.numel()),
            "queue_wait_s": start - t.rollout_end,
            "train_s": end - start,
            "t_commit": end,
            "loss": stats.get(f"marlaas/{a.task}/ppo_actor/update/actor_loss/avg"),
            "grad_norm": stats.get(f"marlaas/{a.task}/ppo_actor/update/grad_norm"),
        }
        self.store.step(record)
        if self.on_step is not None:
            self.on_step(record, stats)
        return TrainDone(a.task, new)

    def _publish(self, a: StartPublish) -> PublishDone:
        start = time.time()
        self.rollout.publish(
            a.task, a.version, str(self.store.adapter_dir(a.task, a.version))
        )
        self.store.event(a.task, a.version, "publish", start, time.time())
        return PublishDone(a.task, a.version)

    # -- report -----------------------------------------------------------------
    def summary(self, wall: float) -> dict[str, Any]:
        tasks = {}
        steps = 0
        for name, t in self.tasks.items():
            state = self.core.tasks[name]
            gaps = [b - a for a, b in zip([t.submitted_at, *t.commits], t.commits)]
            steps += len(t.commits)
            tasks[name] = {
                "steps": len(t.commits),
                "final_version": state.version,
                "status": state.phase.value,
                "error": t.error,
                "reward_first": t.rewards[0] if t.rewards else None,
                "reward_last": t.rewards[-1] if t.rewards else None,
                "ttfs_s": gaps[0] if gaps else None,
                "tpts_p50_s": statistics.median(gaps) if gaps else None,
            }
        return {
            "mode": self.mode,
            "wall_s": wall,
            "train_steps_per_hour": steps / wall * 3600 if wall > 0 else 0.0,
            "tasks": tasks,
        }
