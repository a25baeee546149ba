"""In-memory stand-ins for the runtime's rollout and trainer, for tests that
provoke loop faults the real engines cannot be made to show (thousands of
unreadable KV probes, a trainer that reports the wrong version)."""

from __future__ import annotations

import threading
from pathlib import Path

import torch

from areal_marlaas.rundir.writer import RunStore
from areal_marlaas.scheduler.runtime import TaskRun
from areal_marlaas.tasks.prompt_order import TaskData
from areal_marlaas.trajectory import failure


def traj(version: int, reward: float = 1.0) -> dict:
    return {
        "loss_mask": torch.tensor([[0, 1, 1]]),
        "versions": torch.tensor([[-1, version, version]]),
        "rewards": torch.tensor([reward]),
        "env_intervals": [10.0, 11.5],
    }


class Rollout:
    def __init__(
        self, gate: threading.Event | None = None, fail: str = "", discard: int = 0
    ):
        self.gate = gate
        self.fail = fail
        self.discard = discard  # episodes of each batch that come back failed
        self.version: dict[str, int] = {}
        self.priorities: list[tuple[str, int]] = []

    def publish(self, task, version, path):
        self.version[task] = version

    def set_priority(self, task, priority):
        self.priorities.append((task, priority))

    def remove_task(self, task):
        pass

    def rollout_task(self, rows, workflow, kwargs=None, group_size=1, timeout=None):
        if self.gate is not None:
            assert self.gate.wait(60), "the probe was never polled enough"
        if self.fail:
            return [failure(self.fail) for _ in rows]
        out = [traj(self.version.get(workflow, 0)) for _ in rows]
        for i in range(self.discard):
            out[i] = failure("RolloutDiscarded: tool 'x' failed 4 times (HTTP 503)")
        return out


class Trainer:
    """A pool of one trainer: every task is on trainer 0."""

    count = 1

    def __init__(self, skew: int = 0):
        self.version: dict[str, int] = {}
        self.skew = skew

    def place(self, task):
        return 0

    def unplace(self, task):
        pass

    def trainer_of(self, task):
        return 0

    def remove_task(self, task):
        pass

    def train_task(self, task, batch, valid=None):
        self.version[task] = self.version.get(task, 0) + 1
        return {
            "version": self.version[task] + self.skew,
            "loss": None,
            "grad_norm": None,
            "stats": {},
            "audit": {
                "logprob_gap_mean": None,
                "logprob_gap_max": None,
                "audited_tokens": 0,
            },
            "process": {"page_faults": 0},
        }

    def save_adapter(self, task, path):
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "adapter_model.safetensors").write_bytes(b"x")

    def save_task_state(self, task, path):
        pass

    def release_batch(self, batch):
        pass


def task(name: str, steps: int = 1) -> TaskRun:
    rows = [{"messages": [{"role": "user", "content": str(i)}]} for i in range(4)]
    # The stand-in rollout reads the task name from the workflow argument.
    return TaskRun(name, steps, 2, 2, TaskData(rows, 0), name, {})


def store(tmp_path) -> RunStore:
    s = RunStore(tmp_path / "run")
    for name in ("a", "b"):
        Trainer().save_adapter(name, s.adapter_dir(name, 0))
        s.commit(name, 0, {"cursor": 0, "steps": 0})
    return s


class FakeBackend:
    """A rollout backend that only records which adapters it was given (the
    supervisor's reloads)."""

    def __init__(self):
        self.loaded: list[tuple[str, int, str]] = []
        self.current: dict[str, tuple[int, str]] = {}

    def register_task(self, task, version, path):
        self.loaded.append((task, version, str(path)))
        self.current[task] = (version, str(path))

    def publish(self, task, version, path):
        self.register_task(task, version, path)

    def served(self):
        return dict(self.current)

    def rollout_task(self, rows, *args, **kwargs):
        return [{"row": r} for r in rows]
