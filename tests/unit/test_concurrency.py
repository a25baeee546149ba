"""Adaptive concurrency (``scheduler.concurrency=adaptive``): the loop's load
estimate, the core's ``load`` holds, its invariants under random arrivals,
pauses and cancels, and what it changes in simulated runs."""

from __future__ import annotations

import heapq
import random
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from areal_marlaas.config import ConfigError
from areal_marlaas.config.scheduler import MARLaaSSchedulerConfig
from areal_marlaas.scheduler.concurrency import LoopLoad
from areal_marlaas.scheduler.core import (
    Cancel,
    FinishTask,
    HoldReason,
    HoldRollout,
    Pause,
    PublishDone,
    Resume,
    RolloutDone,
    SchedulerCore,
    StartPublish,
    StartRollout,
    StartTrain,
    Submitted,
    TrainDone,
)
from areal_marlaas.scheduler.tasks import Phase
from areal_marlaas.sim.latency import LatencyModels, RolloutModel
from areal_marlaas.sim.simulator import SimTask, simulate


def test_a_task_offers_its_step_over_its_cycle():
    loop = LoopLoad(trainers=1)
    loop.rolled_out("a", 2.5)
    loop.trained("a", 1.0)
    loop.published("a", 0.5)
    assert loop.estimate("a") == pytest.approx(1.0 / 4.0)
    assert loop.saturation() == pytest.approx(4.0)


def test_an_unmeasured_task_takes_its_tenants_mean_then_everyones_then_the_prior():
    loop = LoopLoad(trainers=1, prior_load=0.5)
    assert loop.estimate("new") == 0.5
    for task, tenant, (z, s) in [("h0", "heavy", (1, 3)), ("l0", "light", (3, 1))]:
        loop.enter(task, tenant)
        loop.rolled_out(task, z)
        loop.trained(task, s)
        loop.published(task, 0)
    assert loop.estimate("h1", "heavy") == pytest.approx(0.75)
    assert loop.estimate("x", "other") == pytest.approx((0.75 + 0.25) / 2)
    assert loop.load == pytest.approx(1.0)  # measurements reach tasks inside


def test_new_tasks_wait_held_load_once_the_trainer_is_saturated():
    """Before anything is measured each task counts as half a trainer: two
    enter, the others wait held ``load`` in submission order."""
    core = SchedulerCore(concurrency="adaptive")
    actions = []
    for i in range(4):
        actions += core.handle(Submitted(f"t{i}", 3))
    assert [a.task for a in actions if isinstance(a, StartRollout)] == ["t0", "t1"]
    held = [a for a in actions if isinstance(a, HoldRollout)]
    assert [(a.task, a.reason) for a in held] == [
        ("t2", HoldReason.LOAD),
        ("t3", HoldReason.LOAD),
    ]


def test_tasks_in_the_loop_pass_the_held_ones_and_a_finished_one_frees_room():
    core = SchedulerCore(concurrency="adaptive")
    for i in range(3):
        core.handle(Submitted(f"t{i}", 1))
    core.handle(RolloutDone("t0", 0, rollout_s=3.0))  # t0 trains
    core.handle(RolloutDone("t1", 0, rollout_s=3.0))
    done = core.handle(TrainDone("t0", 1, train_s=1.0))
    assert StartPublish("t0", 1) in done
    after = core.handle(PublishDone("t0", 1, publish_s=0.0))
    # t0 finished its one step: its room goes to t2, the oldest held task.
    assert FinishTask("t0") in after
    assert StartRollout("t2", 0) in after


def test_measured_light_cycles_let_more_tasks_in():
    """Steps of 1 s against rollouts of 3 s: each task offers 1/4 of the
    trainer, so four are in the loop once that is measured."""
    core = SchedulerCore(concurrency="adaptive")
    for i in range(8):
        core.handle(Submitted(f"t{i}", 5))
    for t in ("t0", "t1"):
        core.handle(RolloutDone(t, 0, rollout_s=3.0))
    core.handle(TrainDone("t0", 1, train_s=1.0))
    core.handle(PublishDone("t0", 1, publish_s=0.0))
    core.handle(TrainDone("t1", 1, train_s=1.0))
    core.handle(PublishDone("t1", 1, publish_s=0.0))
    assert core.loop is not None
    assert core.loop.size == 4
    assert core.loop.load == pytest.approx(1.0)
    rolling_new = {t for t in core.rolling() if core.tasks[t].version == 0}
    assert rolling_new == {"t2", "t3"}


def test_a_paused_task_leaves_the_loop_and_waits_to_enter_again():
    core = SchedulerCore(concurrency="adaptive")
    for i in range(3):
        core.handle(Submitted(f"t{i}", 3))
    core.handle(Pause("t0"))
    core.handle(RolloutDone("t0", 0))
    core.handle(TrainDone("t0", 1))
    actions = core.handle(PublishDone("t0", 1))
    assert StartRollout("t2", 0) in actions  # t0's room went to t2
    assert core.handle(Resume("t0")) == [HoldRollout("t0", 1, HoldReason.LOAD)]


def test_a_task_placed_on_a_trainer_counts_against_that_trainer_alone():
    """Two trainers: trainer 0 holds two tasks (one trainer's worth before
    anything is measured), so its third waits although the whole loop is at
    half its target; trainer 1's task enters."""
    core = SchedulerCore(concurrency="adaptive", trainers=2)
    actions = []
    for name, trainer in [("a", 0), ("b", 0), ("c", 0), ("d", 1)]:
        actions += core.handle(Submitted(name, 3, trainer=trainer))
    started = [a.task for a in actions if isinstance(a, StartRollout)]
    assert started == ["a", "b", "d"]
    assert HoldRollout("c", 0, HoldReason.LOAD) in actions


def test_adaptive_concurrency_needs_the_async_mode():
    with pytest.raises(ValueError, match="needs mode async"):
        SchedulerCore(mode="sync", concurrency="adaptive")
    with pytest.raises(ConfigError, match="scheduler.concurrency=off"):
        MARLaaSSchedulerConfig(mode="sync", concurrency="adaptive")
    with pytest.raises(ConfigError, match="scheduler.target_load"):
        MARLaaSSchedulerConfig(concurrency="adaptive", target_load=0)
    with pytest.raises(ConfigError, match="scheduler.concurrency must be one of"):
        MARLaaSSchedulerConfig(concurrency="auto")


# -- invariants under random arrivals, pauses and cancels -----------------------
def drive(
    n: int, trainers: int, order: str, seed: int, control: bool, pinned: bool
) -> tuple[SchedulerCore, list, list[float]]:
    """Tasks of random step and rollout times arriving at random (``pinned``:
    each placed on a trainer, round robin); returns the core, its actions, and
    each time a new task entered, the load of its part of the loop over that
    part's target (below 1: the rule held)."""
    rng = random.Random(seed)
    core = SchedulerCore(concurrency="adaptive", trainers=trainers, train_order=order)
    assert core.loop is not None
    clock: list[tuple[float, int, object]] = []
    seq = 0

    def at(t: float, event: object) -> None:
        nonlocal seq
        heapq.heappush(clock, (t, seq, event))
        seq += 1

    cost = {f"t{i}": (rng.uniform(1, 8), rng.uniform(0.5, 6)) for i in range(n)}
    for i in range(n):
        trainer = i % trainers if pinned else None
        at(
            rng.uniform(0, 30),
            Submitted(f"t{i}", 3, tenant=f"u{i % 3}", trainer=trainer),
        )
    if control:
        for _ in range(3):
            task, t = f"t{rng.randrange(n)}", rng.uniform(0, 60)
            if rng.random() < 0.5:
                at(t, Cancel(task, "test"))
            else:
                at(t, Pause(task))
                at(t + rng.uniform(1, 30), Resume(task))
    log: list = []
    entered: list[float] = []  # load / target of its part when a task entered
    loop, enter = core.loop, core.loop.enter

    def spy(task: str, tenant: str = "", trainer: int | None = None) -> None:
        if trainer is None:
            entered.append(loop.load / trainers)
        else:
            entered.append(loop.load_on(trainer))
        enter(task, tenant, trainer)

    loop.enter = spy  # type: ignore[method-assign]
    while clock:
        now, _, event = heapq.heappop(clock)
        task = getattr(event, "task", None)
        if isinstance(event, Pause | Resume | Cancel) and task not in core.tasks:
            continue
        actions = core.handle(event)  # type: ignore[arg-type]
        log += actions
        for a in actions:
            if isinstance(a, StartRollout):
                z = cost[a.task][0]
                at(now + z, RolloutDone(a.task, a.version, rollout_s=z))
            elif isinstance(a, StartTrain):
                s = cost[a.task][1]
                at(now + s, TrainDone(a.task, a.version + 1, train_s=s))
            elif isinstance(a, StartPublish):
                at(now + 0.1, PublishDone(a.task, a.version, publish_s=0.1))
        # Work conservation: nobody waits for room in an empty part of the loop.
        for t in core.tasks.values():
            if t.phase is Phase.PENDING and t.held is HoldReason.LOAD:
                part = loop.load if t.trainer is None else loop.load_on(t.trainer)
                assert part > 0, (now, t.name)
    return core, log, entered


@settings(max_examples=120, deadline=None)
@given(
    n=st.integers(1, 12),
    trainers=st.sampled_from([1, 2]),
    order=st.sampled_from(["fifo", "fair"]),
    seed=st.integers(0, 10**6),
    control=st.booleans(),
    pinned=st.booleans(),
)
def test_adaptive_admission_keeps_the_invariants(
    n, trainers, order, seed, control, pinned
):
    core, log, entered = drive(n, trainers, order, seed, control, pinned)
    assert core.finished()  # nobody is held forever
    for name, task in core.tasks.items():
        trained = [
            a.version for a in log if isinstance(a, StartTrain) and a.task == name
        ]
        assert trained == list(range(len(trained)))  # version order, each once
        if task.phase is Phase.DONE:
            assert task.version == 3
    # A new task entered only while its part of the loop was below the target
    # (or empty, load 0).
    assert all(x < 1.0 for x in entered)


# -- simulated runs --------------------------------------------------------------
# Every batch rolls out in 3 s however many share the server (beta 1: no
# batching gain or loss), every step takes 1 s: N* = (3 + 1) / 1 = 4 tasks.
MODELS = LatencyModels(
    rollout=RolloutModel(work_s=3.0, beta=1.0), train_intercept_s=1.0
)


def poisson(n: int, rate_per_s: float, seed: int) -> list[float]:
    rng, t, out = random.Random(seed), 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate_per_s)
        out.append(t)
    return out


def jobs(n: int, seed: int, rate: float) -> list[SimTask]:
    return [
        SimTask(f"j{i}", steps=6, seqs=8, arrival_s=t)
        for i, t in enumerate(poisson(n, rate, seed))
    ]


def test_the_simulator_submits_tasks_when_they_arrive():
    tasks = [SimTask("a", 2, 8), SimTask("b", 2, 8, arrival_s=50.0)]
    result = simulate(tasks, MODELS)
    first_b = min(s["t_commit"] for s in result.steps if s["task"] == "b")
    assert result.arrivals["b"] == 50.0
    assert first_b > 50.0
    assert result.ttfs()["b"] == pytest.approx(first_b - 50.0)


def test_under_overload_adaptive_keeps_throughput_and_shortens_jobs():
    """Rollouts of 3 s, steps of 1 s (N* = 4 tasks), 40 jobs arriving faster
    than the trainer serves them: admitting only what saturates the trainer
    keeps the steps/h within 5% and finishes the average job sooner, at the
    price of queued jobs' time to first step."""

    def run(concurrency: str, seed: int):
        r = simulate(jobs(40, seed, rate=0.3), MODELS, concurrency=concurrency)
        commits: dict[str, float] = {}
        for s in r.steps:
            commits[s["task"]] = max(commits.get(s["task"], 0.0), s["t_commit"])
        jct = statistics.mean(c - r.arrivals[t] for t, c in commits.items())
        return r.train_steps_per_hour, jct

    for seed in range(3):
        off_rate, off_jct = run("off", seed)
        on_rate, on_jct = run("adaptive", seed)
        assert on_rate >= 0.95 * off_rate
        assert on_jct < 0.8 * off_jct
