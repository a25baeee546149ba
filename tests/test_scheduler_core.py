"""The pure scheduling core in async (MARLaaS) mode, driven by random event orders."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from areal_marlaas.scheduler.core import (
    AdmissionError,
    FinishTask,
    ProtocolError,
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


def drive(core: SchedulerCore, steps: dict[str, int], seed: int, fail=None, kv=None):
    """Complete in-flight actions in a random order; check invariants throughout."""
    rng = random.Random(seed)
    pending, log, max_rolling = [], [], 0
    for task, n in steps.items():
        pending += core.handle(Submitted(task, n, kv_bytes=(kv or {}).get(task, 0)))
    while pending:
        action = pending.pop(rng.randrange(len(pending)))
        log.append(action)
        if isinstance(action, FinishTask):
            continue
        if fail and action.task == fail[0] and len(log) >= fail[1]:
            pending += core.handle(TaskFailed(action.task, "injected"))
            pending = [
                a for a in pending if a.task != action.task or isinstance(a, FinishTask)
            ]
            continue
        if isinstance(action, StartRollout):
            # On-policy: a task rolls out exactly the version it last published.
            assert action.version == core.tasks[action.task].version
            event = RolloutDone(action.task, action.version)
        elif isinstance(action, StartTrain):
            event = TrainDone(action.task, action.version + 1)
        else:
            event = PublishDone(action.task, action.version)
        pending += core.handle(event)
        trains = [a for a in pending if isinstance(a, StartTrain)]
        assert len(trains) <= 1  # one serialized trainer
        per_task = [a.task for a in pending if not isinstance(a, FinishTask)]
        assert len(per_task) == len(set(per_task))  # one batch in flight per task
        if core.kv_budget is not None:
            assert core.kv_in_use() <= core.kv_budget
        max_rolling = max(max_rolling, len(core.rolling()))
    return log, max_rolling


@settings(max_examples=200, deadline=None)
@given(
    steps=st.dictionaries(
        st.sampled_from(["a", "b", "c", "d"]), st.integers(0, 4), min_size=1
    ),
    seed=st.integers(0, 10**6),
)
def test_async_any_event_order_finishes_every_task_on_policy(steps, seed):
    core = SchedulerCore()

    log, _ = drive(core, steps, seed)

    assert core.finished()
    for task, n in steps.items():
        assert core.tasks[task].version == n and core.tasks[task].phase == "done"
        # Versions trained in order 0..n-1, each once, each after its publish.
        trained = [
            a.version for a in log if isinstance(a, StartTrain) and a.task == task
        ]
        published = [
            a.version for a in log if isinstance(a, StartPublish) and a.task == task
        ]
        assert trained == list(range(n)) and published == list(range(1, n + 1))


def test_train_queue_is_fifo_across_tasks():
    core = SchedulerCore()
    for t in "abc":
        core.handle(Submitted(t, 2))

    first = core.handle(RolloutDone("b", 0))
    assert first == [StartTrain("b", 0)]
    assert core.handle(RolloutDone("c", 0)) == []
    assert core.handle(RolloutDone("a", 0)) == []

    # b finishes: publish b, and the next in arrival order (c) trains.
    assert core.handle(TrainDone("b", 1)) == [StartPublish("b", 1), StartTrain("c", 0)]
    # b rolls out v1 while c trains: cross-task overlap.
    assert core.handle(PublishDone("b", 1)) == [StartRollout("b", 1)]


def test_failed_task_frees_the_trainer_and_others_finish():
    core = SchedulerCore()

    drive(core, {"a": 3, "b": 3, "c": 3}, seed=7, fail=("b", 5))

    assert core.tasks["b"].phase == "failed"
    assert core.tasks["a"].phase == "done" and core.tasks["c"].phase == "done"


def test_out_of_order_event_is_a_protocol_error():
    core = SchedulerCore()
    core.handle(Submitted("a", 2))
    with pytest.raises(ProtocolError, match="got queue|got rollout"):
        core.handle(RolloutDone("a", 1))
    with pytest.raises(ProtocolError):
        core.handle(TrainDone("a", 1))


def test_resumed_task_starts_from_its_committed_version():
    core = SchedulerCore()
    assert core.handle(Submitted("a", 5, version=3)) == [StartRollout("a", 3)]
    assert core.handle(Submitted("b", 2, version=2)) == [FinishTask("b")]


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 10**6))
def test_budget_for_two_of_four_tasks_never_rolls_out_more_than_two(seed):
    core = SchedulerCore(kv_budget=250)
    kv = {t: 100 for t in "abcd"}

    _, max_rolling = drive(core, {t: 3 for t in "abcd"}, seed, kv=kv)

    assert core.finished() and all(t.phase == "done" for t in core.tasks.values())
    assert max_rolling == 2


def test_admission_follows_priority_then_submission_order():
    core = SchedulerCore(kv_budget=100)
    assert core.handle(Submitted("a", 1, kv_bytes=60)) == [StartRollout("a", 0)]
    assert core.handle(Submitted("b", 1, kv_bytes=60)) == []
    assert core.handle(Submitted("c", 1, kv_bytes=60, priority=5)) == []

    # a's batch is generated: its KV is free; c outranks b.
    actions = core.handle(RolloutDone("a", 0))

    assert StartRollout("c", 0) in actions and StartRollout("b", 0) not in actions


def test_task_larger_than_the_budget_is_refused_at_submission():
    core = SchedulerCore(kv_budget=100)
    with pytest.raises(AdmissionError, match="task 'big'.*could never be admitted"):
        core.handle(Submitted("big", 1, kv_bytes=101))
    assert "big" not in core.tasks
