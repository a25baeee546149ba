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
    """Which tasks are in the loop and the load they offer the trainers. Every
    query and change is O(1) in the number of tasks (sums kept as loads
    change), so an admission pass may ask once per waiting task."""

    trainers: int = 1
    target_load: float = 1.0  # x trainers: the summed load the loop may reach
    prior_load: float = 0.5  # a task's load before anything was measured
    _cycles: dict[str, _Cycle] = field(default_factory=dict, init=False)
    _tenant_of: dict[str, str] = field(default_factory=dict, init=False)
    # Measured loads, and their sums and counts per tenant and over all.
    _known: dict[str, float] = field(default_factory=dict, init=False)
    _by_tenant: dict[str, list[float]] = field(default_factory=dict, init=False)
    _all: list[float] = field(default_factory=lambda: [0.0, 0.0], init=False)
    # Tasks in the loop: their load and trainer; load and count per trainer
    # (None: tasks any trainer may take) and over all.
    _inside: dict[str, float] = field(default_factory=dict, init=False)
    _trainer: dict[str, int | None] = field(default_factory=dict, init=False)
    _parts: dict[int | None, list[float]] = field(default_factory=dict, init=False)
    _total: float = field(default=0.0, init=False)

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
        return self._total  # reset to 0 when the last task leaves

    def load_on(self, trainer: int) -> float:
        """The load the tasks placed on ``trainer`` offer it."""
        part = self._parts.get(trainer)
        return part[0] if part else 0.0

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
        if task in self._known:
            return self._known[task]
        for total, n in (self._by_tenant.get(tenant, (0.0, 0.0)), self._all):
            if n:
                return total / n
        return self.prior_load

    def cycle_s(self, task: str) -> float | None:
        """Seconds of one of ``task``'s cycles (away + step), once measured."""
        c = self._cycles.get(task)
        if c is None or c.away_s is None or c.train_s is None:
            return None
        return c.away_s + c.train_s

    def saturation(self) -> float | None:
        """``trainers x (Z + S) / S`` from the mean measured cycle: how many
        average tasks saturate the trainers (None until one cycle is measured)."""
        total, n = self._all
        return self.trainers * n / total if n and total else None

    # -- changes -----------------------------------------------------------------
    def enter(self, task: str, tenant: str = "", trainer: int | None = None) -> None:
        if task in self._inside:
            return
        self._tenant_of.setdefault(task, tenant)
        self._trainer[task] = trainer
        self._set_inside(task, self.estimate(task, tenant))

    def leave(self, task: str) -> None:
        """The task ended, paused, or has no steps left: it offers no load."""
        if task not in self._inside:
            return
        x = self._inside.pop(task)
        part = self._parts[self._trainer.pop(task)]
        part[0] -= x
        part[1] -= 1
        self._total -= x
        if not part[1]:  # no drift left behind in an empty part
            part[0] = 0.0
        if not self._inside:
            self._total = 0.0

    def _set_inside(self, task: str, x: float) -> None:
        old = self._inside.get(task)
        part = self._parts.setdefault(self._trainer[task], [0.0, 0])
        if old is None:
            part[1] += 1
            old = 0.0
        self._inside[task] = x
        part[0] += x - old
        self._total += x - old

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
        x = self._cycles[task].load()
        if x is None:
            return
        old = self._known.get(task)
        tenant = self._tenant_of.get(task, "")
        sums = [self._all]
        if tenant:
            sums.append(self._by_tenant.setdefault(tenant, [0.0, 0.0]))
        for acc in sums:
            acc[0] += x - (old or 0.0)
            acc[1] += old is None
        self._known[task] = x
        if task in self._inside:
            self._set_inside(task, x)
