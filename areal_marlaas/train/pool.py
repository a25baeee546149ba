"""Several trainer workers behind the one training queue (``scheduler.trainers``).

Each worker is a whole multi-LoRA FSDP engine (AReaL's controller and its
workers, one role each). A task's LoRA weights and AdamW state live on the worker
it is placed on when it is added, so its steps run there only; the scheduling
core learns the placement from the runtime (``Submitted.trainer``) and gives a
free worker the first queued batch placed on it. The pool owns the placement.

The runtime always trains through a pool (``scheduler.backends.TrainBackend``
lists what it calls); a single engine is a pool of one."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from areal_marlaas.rundir.records import StepResult


def trainer_role(index: int) -> str:
    """AReaL role of trainer worker ``index``: actor, actor1, actor2, ..."""
    return "actor" if index == 0 else f"actor{index}"


class TrainerPool:
    """The engines' task methods, each routed to the task's worker."""

    def __init__(self, engines: list[Any]):
        if not engines:
            raise ValueError("a trainer pool needs at least one engine")
        self.engines = list(engines)
        self._placed: dict[str, int] = {}
        # Placed from the service's admission thread, removed from trainers'.
        self._lock = threading.Lock()

    @property
    def count(self) -> int:
        return len(self.engines)

    def place(self, name: str) -> int:
        """The worker holding ``name``; a new task goes to the one holding the
        fewest tasks (the lowest index on a tie)."""
        with self._lock:
            if name not in self._placed:
                load = [0] * self.count
                for i in self._placed.values():
                    load[i] += 1
                self._placed[name] = load.index(min(load))
            return self._placed[name]

    def unplace(self, name: str) -> None:
        """Forget a placement whose task never arrived (its set-up failed)."""
        with self._lock:
            self._placed.pop(name, None)

    def trainer_of(self, name: str) -> int | None:
        """The worker holding ``name``; None when it was never added."""
        with self._lock:
            return self._placed.get(name)

    def engine_of(self, name: str):
        index = self.trainer_of(name)
        if index is None:
            raise KeyError(f"task {name!r} is on no trainer worker (never added)")
        return self.engines[index]

    def add_task(self, name: str, **kwargs: Any) -> None:
        try:
            self.engines[self.place(name)].add_task(name, **kwargs)
        except BaseException:
            self.unplace(name)  # not held anywhere
            raise

    def remove_task(self, name: str) -> None:
        try:
            self.engine_of(name).remove_task(name)
        finally:
            self.unplace(name)

    def train_task(
        self,
        name: str,
        batch: list[dict[str, Any]],
        valid: list[dict[str, Any]] | None = None,
    ) -> StepResult:
        engine = self.engine_of(name)
        out = engine.train_task(name, batch, valid)
        # Freed by the worker that fetched it (the runtime's own release call,
        # which names no task, is a no-op here).
        engine.release_batch(batch)
        return out

    def release_batch(self, batch: list[dict[str, Any]]) -> None:
        """Done in ``train_task``, by the worker that trained on the batch."""

    def save_adapter(self, name: str, path: str | Path) -> str:
        return self.engine_of(name).save_adapter(name, path)

    def save_task_state(self, name: str, path: str | Path) -> str:
        return self.engine_of(name).save_task_state(name, path)

    def destroy(self) -> None:
        errors = []
        for engine in self.engines:
            try:
                engine.destroy()
            except Exception as e:  # the others still go
                errors.append(e)
        if errors:
            raise errors[0]
