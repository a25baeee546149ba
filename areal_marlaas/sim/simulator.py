"""A discrete-event simulator that drives the real ``SchedulerCore`` with modelled
phase latencies instead of a server and a trainer.

Rollouts run on ``rollout_devices`` processor-sharing servers (``RolloutModel``;
a new batch goes to the device with the fewest sequences in flight); the core's
``trainers`` trainers each take ``LatencyModels.train_s`` per step, each task's
steps on the one it was placed on (round robin, as ``marlaas train`` places
them); while both run,
train steps and generation slow by their contention factors; publish is a fixed
delay, and a task's env (tool-call) time a fixed delay after its batch's
generation, off the server. A task is submitted at its ``arrival_s`` (0: at the
start), as jobs reach the service. ``paired`` (as many devices as trainers):
each trainer and one device are one machine, a task's batches go to its
trainer's device, and the contention slows only the pair. The simulator
writes the same phase records and step records a real run does, so the bench's
metrics apply to it unchanged.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Any

from areal_marlaas.bench.run_metrics import run_metrics
from areal_marlaas.scheduler.core import (
    Concurrency,
    FinishTask,
    HoldRollout,
    Mode,
    PublishDone,
    RolloutDone,
    SchedulerCore,
    StartPublish,
    StartRollout,
    StartTrain,
    Submitted,
    TrainDone,
    TrainOrder,
)
from areal_marlaas.sim.latency import LatencyModels

EPS = 1e-9


@dataclass
class SimTask:
    name: str
    steps: int
    seqs: int  # sequences per rollout batch (batch_size x n_samples)
    max_new_tokens: int | None = None
    kv_bytes: int = 0
    priority: int = 0
    env_s: float | None = None  # tool-call time per batch; None = the models'
    profile: str | None = None  # the fitted task whose latencies it has (None: own)
    tenant: str = ""  # train_order=fair: whose share ("": its own name)
    weight: float = 1.0
    arrival_s: float = 0.0  # when it is submitted

    @property
    def fitted(self) -> str:
        return self.profile or self.name


class Device:
    """A processor-sharing rollout server. Every sequence in flight progresses at
    the same rate, so one virtual clock (work served per sequence) and a heap of
    finishing points make each event O(log n)."""

    def __init__(self, model):
        self.model = model
        self.virtual = 0.0
        self.seqs = 0
        self.jobs: list[tuple[float, int, str, int]] = []
        self._order = itertools.count()

    def rate(self) -> float:
        return self.model.rate_per_seq(self.seqs)

    def add(self, task: str, seqs: int, work: float) -> None:
        heapq.heappush(self.jobs, (self.virtual + work, next(self._order), task, seqs))
        self.seqs += seqs

    def next_done(self, speed: float = 1.0) -> float:
        """Seconds until the next batch finishes (inf when idle), at ``speed``
        (below 1 while a train step contends for the machine)."""
        if not self.jobs:
            return float("inf")
        return max(0.0, self.jobs[0][0] - self.virtual) / (self.rate() * speed)

    def advance(self, dt: float, speed: float = 1.0) -> None:
        if self.jobs:
            self.virtual += self.rate() * speed * dt

    def pop_done(self) -> list[str]:
        done = []
        while self.jobs and self.jobs[0][0] <= self.virtual + EPS:
            _, _, task, seqs = heapq.heappop(self.jobs)
            self.seqs -= seqs
            done.append(task)
        return done


@dataclass
class SimResult:
    mode: str
    wall_s: float
    events: list[dict[str, Any]] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    holds: int = 0
    arrivals: dict[str, float] = field(default_factory=dict)  # task -> submitted

    def ttfs(self) -> dict[str, float]:
        """Each task's first commit after its submission."""
        first: dict[str, float] = {}
        for s in self.steps:
            t = s["task"]
            first[t] = min(first.get(t, s["t_commit"]), s["t_commit"])
        return {t: c - self.arrivals.get(t, 0.0) for t, c in first.items()}

    @property
    def train_steps_per_hour(self) -> float:
        return len(self.steps) / self.wall_s * 3600 if self.wall_s > 0 else 0.0

    def metrics(self) -> dict[str, Any]:
        return run_metrics(
            {"events": self.events, "steps": self.steps, "summary": {}}, None
        )


def simulate(
    tasks: list[SimTask],
    models: LatencyModels,
    mode: Mode = Mode.ASYNC,
    rollout_devices: int = 1,
    trainers: int = 1,
    kv_budget: int | None = None,
    max_rolling: int | None = None,
    record: bool = True,
    train_order: TrainOrder = TrainOrder.FIFO,
    concurrency: Concurrency = Concurrency.OFF,
    target_load: float = 1.0,
    paired: bool = False,
) -> SimResult:
    """Run ``tasks`` to completion under ``mode``; times start at 0."""
    if paired and rollout_devices != trainers:
        raise ValueError(
            f"paired machines need as many rollout devices as trainers, got "
            f"{rollout_devices} and {trainers}"
        )
    core = SchedulerCore(
        mode=mode,
        kv_budget=kv_budget,
        max_rolling=max_rolling,
        trainers=trainers,
        train_order=train_order,
        concurrency=concurrency,
        target_load=target_load,
    )
    unfinished = len(tasks)
    spec = {t.name: t for t in tasks}
    devices = [Device(models.rollout) for _ in range(rollout_devices)]
    timers: list[tuple[float, int, str, str, int]] = []
    order = itertools.count()
    now = 0.0
    result = SimResult(mode, 0.0)
    rollout_start: dict[str, float] = {}
    rollout_end: dict[str, float] = {}
    train_start: dict[str, float] = {}
    publish_start: dict[str, float] = {}
    version: dict[str, int] = {}
    ready_at: dict[str, float] = {t.name: t.arrival_s for t in tasks}
    training: dict[str, list] = {}  # task -> [alone-seconds left, its new version]
    placement: dict[str, int] = {}  # task -> its trainer

    def timer(at: float, kind: str, task: str, v: int) -> None:
        heapq.heappush(timers, (at, next(order), kind, task, v))

    def event(task: str, v: int, phase: str, start: float, end: float) -> None:
        if record:
            result.events.append(
                {"task": task, "version": v, "phase": phase, "start": start, "end": end}
            )

    def dispatch(actions) -> None:
        for a in actions:
            if isinstance(a, StartRollout):
                if now > ready_at[a.task] + EPS:  # held: admission, barrier, turn
                    event(a.task, a.version, "wait", ready_at[a.task], now)
                rollout_start[a.task] = now
                version[a.task] = a.version
                timer(now + models.rollout.overhead_s, "serve", a.task, a.version)
            elif isinstance(a, StartTrain):
                train_start[a.task] = now
                event(a.task, a.version, "queue", rollout_end[a.task], now)
                s = spec[a.task]
                training[a.task] = [models.train_s(s.seqs, s.fitted), a.version + 1]
            elif isinstance(a, StartPublish):
                publish_start[a.task] = now
                timer(now + models.publish_s, "published", a.task, a.version)
            elif isinstance(a, FinishTask):
                nonlocal unfinished
                unfinished -= 1
            elif isinstance(a, HoldRollout):
                result.holds += 1

    placed = itertools.count()

    def submit(t: SimTask) -> None:
        # Placed as marlaas train places them (train.pool.TrainerPool): on the
        # trainer holding the fewest tasks, i.e. round robin in submission order.
        placement[t.name] = next(placed) % trainers
        submitted = Submitted(
            t.name,
            t.steps,
            kv_bytes=t.kv_bytes,
            priority=t.priority,
            trainer=placement[t.name],
            tenant=t.tenant,
            weight=t.weight,
        )
        result.arrivals[t.name] = now
        dispatch(core.handle(submitted))

    for t in sorted(tasks, key=lambda t: t.arrival_s):  # stable: list order
        if t.arrival_s <= 0:
            submit(t)
        else:
            timer(t.arrival_s, "arrive", t.name, 0)

    def trained(task: str, v: int) -> None:
        event(task, v - 1, "train", train_start[task], now)
        result.steps.append(
            {
                "task": task,
                "version": v,
                "t_commit": now,
                "n_trajectories": spec[task].seqs,
            }
        )
        dispatch(core.handle(TrainDone(task, v, train_s=now - train_start[task])))

    slow_train = 1 / (1 + models.train_contention)
    slow_gen = 1 / (1 + models.rollout.contention)
    while unfinished > 0:
        # Contention: one machine (every device and trainer share it), or, paired,
        # trainer i and device i.
        if paired:
            busy = {placement[t] for t in training}
            gen = [slow_gen if i in busy else 1.0 for i in range(len(devices))]
            speed = {
                t: slow_train if devices[placement[t]].seqs else 1.0 for t in training
            }
        else:
            gen = [slow_gen if training else 1.0] * len(devices)
            one = slow_train if any(d.seqs for d in devices) else 1.0
            speed = dict.fromkeys(training, one)
        t_timer = timers[0][0] if timers else float("inf")
        dt_dev = min(
            (d.next_done(g) for d, g in zip(devices, gen, strict=True)),
            default=float("inf"),
        )
        dt_train = min(
            (j[0] / speed[t] for t, j in training.items()), default=float("inf")
        )
        t_next = min(t_timer, now + dt_dev, now + dt_train)
        if t_next == float("inf"):
            raise RuntimeError(
                "simulation stalled: nothing in flight but tasks unfinished "
                f"({ {n: s.phase.value for n, s in core.tasks.items()} })"
            )
        for d, g in zip(devices, gen, strict=True):
            d.advance(t_next - now, g)
        for t, job in training.items():
            job[0] -= (t_next - now) * speed[t]
        now = t_next
        for task in [t for t, job in training.items() if job[0] <= EPS]:
            trained(task, training.pop(task)[1])
        for d in devices:
            for task in d.pop_done():
                env = spec[task].env_s
                env = models.env_of(spec[task].fitted) if env is None else env
                timer(now + env, "rolled", task, version[task])
                if env > 0:
                    event(task, version[task], "env", now, now + env)
        while timers and timers[0][0] <= now + EPS:
            _, _, kind, task, v = heapq.heappop(timers)
            if kind == "arrive":
                submit(spec[task])
            elif kind == "serve":
                if paired:
                    dev = devices[placement[task]]
                else:
                    dev = min(devices, key=lambda d: d.seqs)
                s = spec[task]
                dev.add(
                    task, s.seqs, models.rollout.work_of(s.max_new_tokens, s.fitted)
                )
            elif kind == "rolled":
                rollout_end[task] = now
                event(task, v, "rollout", rollout_start[task], now)
                rolled = RolloutDone(task, v, rollout_s=now - rollout_start[task])
                dispatch(core.handle(rolled))
            elif kind == "published":
                event(task, v, "publish", publish_start[task], now)
                ready_at[task] = now
                took = now - publish_start[task]
                dispatch(core.handle(PublishDone(task, v, publish_s=took)))
    assert core.finished()
    result.wall_s = now
    return result
