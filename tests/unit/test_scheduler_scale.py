"""The core's work per event at a thousand tenants, the counts it keeps to stay
that cheap (checked against a recount after every event), and the training
queue's orders."""

from __future__ import annotations

import random
import time
from collections import Counter, deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from areal_marlaas.scheduler.core import (
    MODES,
    Cancel,
    KVUsage,
    Pause,
    Phase,
    PublishDone,
    Resume,
    RolloutDone,
    SchedulerCore,
    StartPublish,
    StartRollout,
    StartTrain,
    Submitted,
    TaskError,
    TrainDone,
)
from areal_marlaas.scheduler.train_queue import (
    TRAIN_ORDERS,
    FairTrainQueue,
    FIFOTrainQueue,
    FirstStepsTrainQueue,
    TrainOrder,
    create_train_queue,
)

# Events per second the core must sustain with 1,000 tasks. One that rescans
# every task per queued batch or per waiting task (O(n^2) per event) manages
# 6-90 here; the kept counts make it over 15,000 on one loaded core: the floor
# sits 10x above the one and 15x below the other.
MIN_EVENTS_PER_S = 1_000


def drive_fifo(core: SchedulerCore, n: int, steps: int, deadline: float) -> int:
    """Submit ``n`` tasks and complete every started phase in start order, until
    all finish or ``deadline`` (perf_counter) passes; returns the events fed."""
    pending: deque = deque()
    events = 0
    for i in range(n):
        if time.perf_counter() > deadline:
            return events
        trainer = i % core.trainers if core.trainers > 1 else None
        pending += core.handle(
            Submitted(f"t{i}", steps, kv_bytes=10, priority=i % 3, trainer=trainer)
        )
        events += 1
    while pending and time.perf_counter() < deadline:
        a = pending.popleft()
        if isinstance(a, StartRollout):
            event = RolloutDone(a.task, a.version)
        elif isinstance(a, StartTrain):
            event = TrainDone(a.task, a.version + 1)
        elif isinstance(a, StartPublish):
            event = PublishDone(a.task, a.version)
        else:
            continue
        pending += core.handle(event)
        events += 1
    return events


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "limits",
    [
        {},
        {
            "kv_budget": 200,
            "max_rolling": 50,
            "trainers": 2,
            "train_order": "first_steps",
        },
    ],
    ids=["plain", "admission"],
)
def test_a_thousand_tenants_cost_the_core_little_per_event(mode, limits):
    n, steps = 1_000, 2
    expected = n + 3 * n * steps  # submissions, then 3 phases per step
    core = SchedulerCore(mode=mode, **limits)
    start = time.perf_counter()
    events = drive_fifo(core, n, steps, deadline=start + expected / MIN_EVENTS_PER_S)
    rate = events / (time.perf_counter() - start)

    assert core.finished(), f"{events}/{expected} events at {rate:.0f}/s"
    assert events == expected


def recount(core: SchedulerCore) -> dict:
    """The table's counts, recomputed from every task."""
    running = [t for t in core.tasks.values() if t.running]
    waiting = [t for t in running if t.phase is Phase.PENDING]
    by = Counter

    def keys(ts):
        return sorted(t.key for t in ts)

    def at(ts, attr):
        groups: dict = {}
        for t in ts:
            groups.setdefault(getattr(t, attr), []).append(t)
        return {k: keys(v) for k, v in groups.items()}

    rolling = [t for t in running if t.phase is Phase.ROLLOUT]
    return {
        "live": sum(t.active for t in core.tasks.values()),
        "running": keys(running),
        "versions": by(t.version for t in running),
        "publishing": by(t.version for t in running if t.phase is Phase.PUBLISH),
        "unrolled": by(
            t.version for t in running if t.phase in (Phase.PENDING, Phase.ROLLOUT)
        ),
        "queued": by(t.version for t in running if t.phase is Phase.QUEUED),
        "waiting": keys(waiting),
        "waiting_at": at(waiting, "version"),
        "waiting_held": at(waiting, "held"),
        "rolling": sorted(t.name for t in rolling),
        "rolling_kv": sum(t.kv_bytes for t in rolling),
        "queue": sorted(t.name for t in running if t.phase is Phase.QUEUED),
    }


def kept(core: SchedulerCore) -> dict:
    table = core.table
    return {
        "live": table.live,
        "running": table.running,
        "versions": table.versions,
        "publishing": table.publishing,
        "unrolled": table.unrolled,
        "queued": table.queued,
        "waiting": table.waiting,
        "waiting_at": table.waiting_at,
        "waiting_held": {k: v for k, v in table.waiting_held.items() if v},
        "rolling": sorted(table.rolling),
        "rolling_kv": table.rolling_kv,
        "queue": sorted(core.train_queue),
    }


@settings(max_examples=150, deadline=None)
@given(
    mode=st.sampled_from(MODES),
    order=st.sampled_from(TRAIN_ORDERS),
    trainers=st.integers(1, 3),
    kv_budget=st.sampled_from([None, 100, 250]),
    max_rolling=st.sampled_from([None, 1, 2]),
    n=st.integers(1, 7),
    seed=st.integers(0, 10**6),
)
def test_the_kept_counts_match_a_recount_after_every_event(
    mode, order, trainers, kv_budget, max_rolling, n, seed
):
    """Random arrivals, completions, errors, pauses, resumes, cancels and KV
    reports: after each, what the table keeps is what a recount finds."""
    rng = random.Random(seed)
    core = SchedulerCore(
        mode=mode,
        trainers=trainers,
        kv_budget=kv_budget,
        max_rolling=max_rolling,
        task_retries=1,
        train_order=order,
    )
    names = [f"t{i}" for i in range(n)]
    pending: list = []
    for _ in range(300):
        unsent = [t for t in names if t not in core.tasks]
        r = rng.random()
        if unsent and (r < 0.1 or not pending):
            version = rng.choice([0, 0, 1])
            event = Submitted(
                unsent[0],
                version + rng.randint(0, 3),
                version,
                kv_bytes=rng.choice([0, 40, 90]),
                priority=rng.randint(0, 2),
                trainer=rng.choice([None, rng.randrange(trainers)]),
            )
        elif core.tasks and r < 0.25:
            control = rng.choice([Pause, Resume, Resume, Cancel])
            event = control(rng.choice(list(core.tasks)))
        elif r < 0.3:
            event = KVUsage(rng.choice([0, 60, 300]))
        elif pending:
            a = pending.pop(rng.randrange(len(pending)))
            if rng.random() < 0.08:
                event = TaskError(a.task, "injected")
            elif isinstance(a, StartRollout):
                event = RolloutDone(a.task, a.version)
            elif isinstance(a, StartTrain):
                event = TrainDone(a.task, a.version + 1)
            else:
                event = PublishDone(a.task, a.version)
        else:
            paused = [t for t, s in core.tasks.items() if s.phase is Phase.PAUSED]
            if not paused:
                break
            event = Resume(paused[0])
        actions = core.handle(event)
        pending += [a for a in actions if isinstance(a, StartRollout | StartTrain)]
        pending += [a for a in actions if isinstance(a, StartPublish)]
        live = {name for name, t in core.tasks.items() if t.active}
        pending = [a for a in pending if a.task in live]
        assert kept(core) == recount(core), event


def test_each_train_order_is_one_queue_class():
    assert TRAIN_ORDERS == ("fifo", "first_steps", "fair")
    assert {o: type(create_train_queue(o)) for o in TrainOrder} == {
        TrainOrder.FIFO: FIFOTrainQueue,
        TrainOrder.FIRST_STEPS: FirstStepsTrainQueue,
        TrainOrder.FAIR: FairTrainQueue,
    }
    with pytest.raises(ValueError, match="train_order must be one of"):
        create_train_queue("lifo")


def test_the_first_steps_queue_puts_first_batches_ahead_and_keeps_fifo_within():
    class Batch:
        def __init__(self, name, version, start_version=0):
            self.name, self.version, self.start_version = name, version, start_version

    q = create_train_queue("first_steps")
    for b in (Batch("a", 1), Batch("n", 0), Batch("b", 2), Batch("r", 3, 3)):
        q.add(b)
    assert list(q) == ["n", "r", "a", "b"] and len(q) == 4 and "r" in q
    q.remove("n")
    q.discard("zz")  # not queued: nothing to do
    assert list(q) == ["r", "a", "b"]
    with pytest.raises(KeyError):
        q.remove("n")
    fifo = create_train_queue(TrainOrder.FIFO)
    for b in (Batch("a", 1), Batch("n", 0)):
        fifo.add(b)
    assert list(fifo) == ["a", "n"]
