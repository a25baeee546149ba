"""Elastic placement: the in-process trainer borrows the rollout server's cores
while no rollout is in flight and gives them back as soon as one starts.

On a CPU machine the rollout server sits idle whenever every tenant is queued
for the trainer; its cores then add threads to the train step. The switch is
checked at every decoder layer (forward, and backward through a gradient hook),
so a rollout that starts mid-step gets its cores back within one layer. Each
step reports what it used (``cores_mean``, ``borrowed_s``).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from areal_marlaas.scheduler.backends import TrainBackend

from areal_marlaas.rundir.records import StepPlacement, StepResult


def _set_process_affinity(cpus: set[int]) -> None:
    """Every thread of this process (torch's OpenMP pool included) on ``cpus``."""
    for tid in os.listdir("/proc/self/task"):
        # ProcessLookupError: the thread ended meanwhile.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.sched_setaffinity(int(tid), cpus)


def _layer_list(model: torch.nn.Module) -> torch.nn.ModuleList | None:
    """The decoder layers: the longest ModuleList in the model."""
    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
    return max(lists, key=len, default=None)


class ElasticCores:
    """Sizes torch's threads and this process's affinity from ``busy()``:
    ``own`` cores while it is true, ``own | borrow`` while it is false."""

    def __init__(self, own: set[int], borrow: set[int], busy: Callable[[], bool]):
        self.own = set(own)
        self.all = set(own) | set(borrow)
        self.busy = busy
        self._cores = self.own
        self._since = time.monotonic()
        self._core_s = 0.0  # sum of cores x seconds this step
        self._borrowed_s = 0.0
        self._step_start: float | None = None
        self._owner = threading.get_ident()
        self.switches = 0
        self._hooks: list[Any] = []

    # -- the switch ---------------------------------------------------------
    def adjust(self) -> None:
        """Borrow or give back; only the training thread may resize torch's pool
        (OpenMP thread counts are per calling thread)."""
        if self._step_start is None or threading.get_ident() != self._owner:
            return
        want = self.own if self.busy() else self.all
        if want != self._cores:
            self._switch(want)
            self.switches += 1

    def _switch(self, want: set[int]) -> None:
        self._account()
        _set_process_affinity(want)
        torch.set_num_threads(len(want))
        self._cores = want

    def _account(self) -> float:
        now = time.monotonic()
        if self._step_start is not None:
            span = now - max(self._since, self._step_start)
            self._core_s += span * len(self._cores)
            if self._cores != self.own:
                self._borrowed_s += span
        self._since = now
        return now

    def give_back(self) -> None:
        """Own cores only (between steps: rollouts and rewards run here too)."""
        if self._cores != self.own:
            self._switch(self.own)

    # -- per step -----------------------------------------------------------
    def step_begin(self) -> None:
        self._owner = threading.get_ident()
        self._step_start = self._since = time.monotonic()
        self._core_s = self._borrowed_s = 0.0
        self.adjust()

    def step_end(self) -> StepPlacement:
        """What the step used: mean cores over its wall time, seconds borrowed."""
        now = self._account()
        span = now - (self._step_start if self._step_start is not None else now)
        out: StepPlacement = {
            "cores_mean": self._core_s / span if span > 0 else float(len(self.own)),
            "borrowed_s": self._borrowed_s,
        }
        self._step_start = None
        self.give_back()
        return out

    # -- hooks --------------------------------------------------------------
    def install(self, model: torch.nn.Module) -> int:
        """Check the switch before every decoder layer's forward and backward;
        returns the number of layers hooked (none when there is nothing to
        borrow: the hooks run on every layer of every step)."""
        if self.all == self.own:
            return 0
        layers = _layer_list(model)
        mods = [model, *(layers or [])]

        def pre(_mod, _args):
            self.adjust()

        def post(_mod, _args, out):
            t = out[0] if isinstance(out, tuple) else out
            if torch.is_tensor(t) and t.requires_grad:
                t.register_hook(self._grad_hook)

        for m in mods:
            self._hooks.append(m.register_forward_pre_hook(pre))
            self._hooks.append(m.register_forward_hook(post))
        return len(mods) - 1

    def _grad_hook(self, grad: torch.Tensor) -> torch.Tensor:
        self.adjust()
        return grad


class ElasticTrainBackend:
    """The engine with elastic cores around each step; adds what the step used
    to its result (the runtime writes it to steps.jsonl)."""

    def __init__(self, engine: TrainBackend, cores: ElasticCores):
        self._engine = engine
        self.cores = cores

    # The rest of the runtime's TrainBackend, forwarded to the engine.
    @property
    def count(self) -> int:
        return self._engine.count

    def place(self, task: str) -> int:
        return self._engine.place(task)

    def unplace(self, task: str) -> None:
        self._engine.unplace(task)

    def trainer_of(self, task: str) -> int | None:
        return self._engine.trainer_of(task)

    def release_batch(self, batch: list[dict[str, Any]]) -> None:
        self._engine.release_batch(batch)

    def save_adapter(self, task: str, path: str) -> Any:
        return self._engine.save_adapter(task, path)

    def save_task_state(self, task: str, path: str) -> Any:
        return self._engine.save_task_state(task, path)

    def remove_task(self, task: str) -> None:
        self._engine.remove_task(task)

    def train_task(
        self,
        task: str,
        batch: list[dict[str, Any]],
        valid: list[dict[str, Any]] | None = None,
    ) -> StepResult:
        self.cores.step_begin()
        try:
            result = self._engine.train_task(task, batch, valid)
        finally:
            used = self.cores.step_end()
        return {**result, "placement": used}

    def __getattr__(self, name: str):
        return getattr(self._engine, name)
