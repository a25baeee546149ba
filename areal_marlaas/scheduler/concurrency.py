"""Adaptive concurrency (``scheduler.concurrency=adaptive``): how many tasks are
in the loop (rolling out, queued, training, publishing) at once.

A task in the loop spends ``Z`` seconds away from the trainer per cycle (its
rollout and publish) and ``S`` on it (its step), so it offers the trainers a
load of ``S / (Z + S)``; ``trainers`` trainers saturate when the loads of the
tasks in the loop add up to ``trainers`` (the closed-queue view: with equal
tasks, ``N* = trainers x (Z + S) / S``). Past that point each extra task buys
no throughput and adds about one step to every task's cycle and to a new
task's time to first step. So a task that has not started since it was
submitted (or resumed) enters the loop only while the summed load of the tasks
in it is below ``trainers x target_load``; the others wait, held with reason
``load``, in admission order. ``target_load`` > 1 trades a newcomer's wait in
the training queue for fewer idle trainer gaps. A task placed on one trainer
(its state lives there) counts against that trainer alone: it enters while
that trainer's tasks offer it less than ``target_load``, so a busy trainer
does not keep an idle one's tasks out, nor an idle one let more onto a busy
one.

Loads come from measured seconds (``RolloutDone.rollout_s``,
``PublishDone.publish_s``, ``TrainDone.train_s``), each task's own as an
exponential moving average; a task not yet measured is assumed to offer its
tenant's mean load, else the mean over all measured tasks, else
``prior_load``. The module is pure (no clock): the runtime and the simulator
hand it the seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class Concurrency(StrEnum):
    """``scheduler.concurrency``: whether the loop's size is limited."""

    OFF = "off"  # every task rolls out as KV admission allows
    ADAPTIVE = "adaptive"  # new tasks wait while the trainers are saturated


CONCURRENCIES = tuple(c.value for c in Concurrency)

_ALPHA = 0.5  # weight of the newest measurement in a task's moving average


@dataclass
class _Cycle:
    away_s: float | None = None  # rollout + publish, per cycle
    train_s: float | None = None
    rollout_s: float | None = None  # this cycle's, until its publish adds to it

    def load(self) -> float | None:
        if self.away_s is None or self.train_s is None:
            return None
        total = self.away_s + self.train_s
        return self.train_s / total if total > 0 else 1.0


def _ewma(old: float | None, new: float) -> float:
    return new if old is None else (1 - _ALPHA) * old + _ALPHA * new


@dataclass
class LoopLoad:
    """Which tasks are in the loop and the load they offer the trainers."""

    trainers: int = 1
    target_load: float = 1.0  # x trainers: the summed load the loop may reach
    prior_load: float = 0.5  # a task's load before anything was measured
    _cycles: dict[str, _Cycle] = field(default_factory=dict, init=False)
    _tenant_of: dict[str, str] = field(default_factory=dict, init=False)
    _inside: dict[str, float] = field(default_factory=dict, init=False)  # -> load
    _trainer: dict[str, int | None] = field(default_factory=dict, init=False)

    def __post_init__(self):
        if self.trainers < 1:
            raise ValueError(f"trainers must be >= 1, got {self.trainers}")
        if not self.target_load > 0:
            raise ValueError(f"target_load must be > 0, got {self.target_load}")
        if not 0 < self.prior_load <= 1:
            raise ValueError(f"prior_load must be in (0, 1], got {self.prior_load}")

    # -- queries -----------------------------------------------------------------
    def inside(self, task: str) -> bool:
        return task in self._inside

    @property
    def size(self) -> int:
        """Tasks in the loop now."""
        return len(self._inside)

    @property
    def load(self) -> float:
        """The summed load the tasks in the loop offer (1.0 = one busy trainer)."""
        return sum(self._inside.values())

    def load_on(self, trainer: int) -> float:
        """The load the tasks placed on ``trainer`` offer it."""
        return sum(x for t, x in self._inside.items() if self._trainer[t] == trainer)

    def may_enter(self, trainer: int | None = None) -> bool:
        """Whether one more task (placed on ``trainer``; None: any) may enter:
        nothing is in its part of the loop, or that part's load is still
        below the target."""
        if trainer is None:
            load, cap = self.load, self.trainers * self.target_load
        else:
            load, cap = self.load_on(trainer), self.target_load
        return load < cap  # an empty part (load 0) always takes one

    def estimate(self, task: str, tenant: str = "") -> float:
        """The load ``task`` offers: its own measurement, else its tenant's
        mean, else the mean of all, else the prior."""
        own = self._cycles.get(task)
        if own is not None and (x := own.load()) is not None:
            return x
        loads = {t: c.load() for t, c in self._cycles.items()}
        known = {t: x for t, x in loads.items() if x is not None}
        mine = [x for t, x in known.items() if tenant and self._tenant_of[t] == tenant]
        pool = mine or list(known.values())
        return sum(pool) / len(pool) if pool else self.prior_load

    def cycle_s(self, task: str) -> float | None:
        """Seconds of one of ``task``'s cycles (away + step), once measured."""
        c = self._cycles.get(task)
        if c is None or c.away_s is None or c.train_s is None:
            return None
        return c.away_s + c.train_s

    def saturation(self) -> float | None:
        """``trainers x (Z + S) / S`` from the mean measured cycle: how many
        average tasks saturate the trainers (None until one cycle is measured)."""
        loads = [x for c in self._cycles.values() if (x := c.load()) is not None]
        if not loads:
            return None
        return self.trainers * len(loads) / sum(loads)

    # -- changes -----------------------------------------------------------------
    def enter(self, task: str, tenant: str = "", trainer: int | None = None) -> None:
        self._tenant_of.setdefault(task, tenant)
        self._inside[task] = self.estimate(task, tenant)
        self._trainer[task] = trainer

    def leave(self, task: str) -> None:
        """The task ended, paused, or has no steps left: it offers no load."""
        self._inside.pop(task, None)
        self._trainer.pop(task, None)

    def rolled_out(self, task: str, seconds: float | None) -> None:
        if seconds is not None:
            self._cycles.setdefault(task, _Cycle()).rollout_s = max(0.0, seconds)

    def trained(self, task: str, seconds: float | None) -> None:
        if seconds is None:
            return
        c = self._cycles.setdefault(task, _Cycle())
        c.train_s = _ewma(c.train_s, max(0.0, seconds))
        self._update(task)

    def published(self, task: str, seconds: float | None) -> None:
        c = self._cycles.setdefault(task, _Cycle())
        if c.rollout_s is None:
            return  # no rollout measured this cycle: nothing to add it to
        away = c.rollout_s + max(0.0, seconds or 0.0)
        c.rollout_s = None
        c.away_s = _ewma(c.away_s, away)
        self._update(task)

    def _update(self, task: str) -> None:
        if task in self._inside:
            x = self._cycles[task].load()
            if x is not None:
                self._inside[task] = x
