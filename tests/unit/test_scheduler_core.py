"""The pure scheduling core in every mode, driven by random event orders."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from areal_marlaas.scheduler.core import (
    AdmissionError,
    Cancel,
    EvalDone,
    FinishTask,
    HoldReason,
    HoldRollout,
    KVUsage,
    Pause,
    ProtocolError,
    PublishDone,
    Resume,
    RolloutDone,
    SchedulerCore,
    StartEval,
    StartPublish,
    StartRollout,
    StartTrain,
    Submitted,
    TaskError,
    TaskFailed,
    TaskPaused,
    TrainDone,
)

# Up to four tasks of 0-4 steps each, and the seed of the event order.
TASK_STEPS = st.dictionaries(
    st.sampled_from(["a", "b", "c", "d"]), st.integers(0, 4), min_size=1
)
SEEDS = st.integers(0, 10**6)


def drive(
    core: SchedulerCore,
    steps: dict[str, int],
    seed: int,
    fail=None,
    kv=None,
    check=None,
    errors=None,
    placed=None,
    eval_every=0,
    train_only=(),
):
    """Complete in-flight actions in a random order; check invariants throughout.

    ``fail=(task, n)`` fails ``task`` for good once n actions ran; ``errors`` maps
    a task to how many of its phases raise (retriable) before succeeding;
    ``placed`` maps a task to its trainer; ``train_only`` tasks need no rollout;
    ``check(core, action, in_flight)`` runs at every started action."""
    rng = random.Random(seed)
    pending, log, max_rolling = [], [], 0
    errors = dict(errors or {})
    for task, n in steps.items():
        kv_bytes = (kv or {}).get(task, 0)
        trainer = (placed or {}).get(task)
        pending += core.handle(
            Submitted(
                task,
                n,
                kv_bytes=kv_bytes,
                trainer=trainer,
                eval_every=eval_every,
                eval_kv_bytes=kv_bytes,
                rollout=task not in train_only,
            )
        )
    while True:
        pending = [a for a in pending if not isinstance(a, HoldRollout)]
        if not pending:
            break
        action = pending.pop(rng.randrange(len(pending)))
        log.append(action)
        if isinstance(action, FinishTask):
            continue
        if check is not None:
            check(core, action, pending)
        if fail and action.task == fail[0] and len(log) >= fail[1]:
            pending += core.handle(TaskFailed(action.task, "injected"))
            pending = [
                a for a in pending if a.task != action.task or isinstance(a, FinishTask)
            ]
            continue
        if errors.get(action.task, 0) > 0:
            errors[action.task] -= 1
            pending += core.handle(TaskError(action.task, "injected error"))
            continue
        if isinstance(action, StartRollout):
            assert action.task not in train_only, action
            # On-policy: a task rolls out exactly the version it last published.
            assert action.version == core.tasks[action.task].version
            event = RolloutDone(action.task, action.version)
        elif isinstance(action, StartTrain):
            event = TrainDone(action.task, action.version + 1)
        elif isinstance(action, StartEval):
            # Beside its task's next rollout, at the version last published.
            assert action.version <= core.tasks[action.task].version
            event = EvalDone(action.task, action.version)
        else:
            event = PublishDone(action.task, action.version)
        pending += core.handle(event)
        trains = [a for a in pending if isinstance(a, StartTrain)]
        assert len(trains) <= core.trainers  # serialized trainer(s)
        per_task = [
            a.task
            for a in pending
            if not isinstance(a, FinishTask | HoldRollout | StartEval)
        ]
        assert len(per_task) == len(set(per_task))  # one batch in flight per task
        if core.kv_budget is not None:
            assert core.kv_in_use() <= core.kv_budget
        max_rolling = max(max_rolling, len(core.rolling()))
    return log, max_rolling


@settings(max_examples=200, deadline=None)
@given(steps=TASK_STEPS, seed=SEEDS)
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


def _queue_with_a_newcomer(order: str) -> SchedulerCore:
    """a and b have committed a step and queued their next batches (in that
    order) while c trains its first; d arrives and queues its first batch."""
    core = SchedulerCore(train_order=order)
    for t in "abc":
        core.handle(Submitted(t, 3))
    for t in "ab":
        core.handle(RolloutDone(t, 0))
        if t == "a":
            core.handle(TrainDone("a", 1))
        else:
            core.handle(RolloutDone("c", 0))
            core.handle(TrainDone("b", 1))  # c trains its first step now
    for t in "ab":
        core.handle(PublishDone(t, 1))
        core.handle(RolloutDone(t, 1))
    core.handle(Submitted("d", 3))
    core.handle(RolloutDone("d", 0))
    # The queue lists its batches in the order trainers take them.
    taken = ["a", "b", "d"] if order == "fifo" else ["d", "a", "b"]
    assert core.training == {"c": 0} and list(core.train_queue) == taken
    return core


def test_first_steps_order_trains_a_newcomer_first_batch_ahead_of_later_steps():
    fifo, first = _queue_with_a_newcomer("fifo"), _queue_with_a_newcomer("first_steps")

    assert fifo.handle(TrainDone("c", 1)) == [StartPublish("c", 1), StartTrain("a", 1)]
    assert first.handle(TrainDone("c", 1)) == [
        StartPublish("c", 1),
        StartTrain("d", 0),
    ]
    # Then FIFO again: d's next batch does not jump ahead of a and b.
    assert first.handle(TrainDone("d", 1))[-1] == StartTrain("a", 1)
    first.handle(PublishDone("d", 1))
    first.handle(RolloutDone("d", 1))
    assert list(first.train_queue) == ["b", "d"]
    assert first.handle(TrainDone("a", 2))[-1] == StartTrain("b", 1)
    assert first.handle(TrainDone("b", 2))[-1] == StartTrain("d", 1)


def test_a_resumed_task_first_batch_counts_from_its_submitted_version():
    core = SchedulerCore(train_order="first_steps")
    core.handle(Submitted("a", 4))
    core.handle(RolloutDone("a", 0))  # a trains v0
    core.handle(Submitted("b", 4))
    core.handle(Submitted("r", 5, version=2))  # resumed at its committed v2
    core.handle(RolloutDone("b", 0))
    core.handle(TrainDone("a", 1))  # b trains v0
    core.handle(PublishDone("a", 1))
    core.handle(RolloutDone("a", 1))
    core.handle(RolloutDone("r", 2))
    # r's first batch here is v2: it goes ahead of a's second step.
    assert list(core.train_queue) == ["r", "a"]
    assert core.handle(TrainDone("b", 1))[-1] == StartTrain("r", 2)
    assert core.handle(TrainDone("r", 3))[-1] == StartTrain("a", 1)


@settings(max_examples=100, deadline=None)
@given(steps=TASK_STEPS, seed=SEEDS)
def test_first_steps_order_any_event_order_stays_on_policy(steps, seed):
    core = SchedulerCore(train_order="first_steps")

    log, _ = drive(core, steps, seed)

    assert core.finished()
    for task, n in steps.items():
        trained = [
            a.version for a in log if isinstance(a, StartTrain) and a.task == task
        ]
        assert core.tasks[task].version == n and trained == list(range(n))


def test_unknown_train_order_is_refused():
    with pytest.raises(ValueError, match="train_order must be one of"):
        SchedulerCore(train_order="lifo")


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
    assert core.handle(Submitted("b", 1, kv_bytes=60)) == [HoldRollout("b", 0, "kv")]
    assert core.handle(Submitted("c", 1, kv_bytes=60, priority=5)) == [
        HoldRollout("c", 0, "kv")
    ]

    # a's batch is generated: its KV is free; c outranks b.
    actions = core.handle(RolloutDone("a", 0))

    assert StartRollout("c", 0) in actions and StartRollout("b", 0) not in actions


def test_task_larger_than_the_budget_is_refused_at_submission():
    core = SchedulerCore(kv_budget=100)
    with pytest.raises(AdmissionError, match="task 'big'.*could never be admitted"):
        core.handle(Submitted("big", 1, kv_bytes=101))
    assert "big" not in core.tasks


# -- sync (multi-LoRA synchronous) ----------------------------------------------
def sync_barriers(core: SchedulerCore, action, in_flight) -> None:
    """Round v+1 starts only after every task committed and published v; round
    v trains only after its last rollout."""
    others = [u for u in core.tasks.values() if u.active and u.name != action.task]
    if isinstance(action, StartRollout):
        for u in others:
            assert u.version >= action.version, (action, u)
            assert not (u.version == action.version and u.phase == "publish")
    if isinstance(action, StartTrain):
        for u in others:
            assert not (u.version == action.version and u.phase == "rollout")
            assert not (u.version == action.version and u.phase == "pending")


@settings(max_examples=150, deadline=None)
@given(steps=TASK_STEPS, seed=SEEDS)
def test_sync_never_starts_next_round_before_every_task_committed(steps, seed):
    core = SchedulerCore(mode="sync")

    log, _ = drive(core, steps, seed, check=sync_barriers)

    assert core.finished()
    for task, n in steps.items():
        assert core.tasks[task].version == n


def test_sync_round_trains_only_after_the_last_rollout():
    core = SchedulerCore(mode="sync")
    for t in "ab":
        core.handle(Submitted(t, 2))

    assert core.handle(RolloutDone("a", 0)) == []  # b still rolling: barrier
    assert core.handle(RolloutDone("b", 0)) == [StartTrain("a", 0)]
    assert core.handle(TrainDone("a", 1)) == [StartPublish("a", 1), StartTrain("b", 0)]
    # a published, but b has not: a waits for the round barrier.
    assert core.handle(PublishDone("a", 1)) == [HoldRollout("a", 1, "barrier")]
    assert core.handle(TrainDone("b", 1)) == [StartPublish("b", 1)]
    assert core.handle(PublishDone("b", 1)) == [
        StartRollout("a", 1),
        StartRollout("b", 1),
    ]


def test_sync_failed_task_releases_the_barrier():
    core = SchedulerCore(mode="sync")
    for t in "ab":
        core.handle(Submitted(t, 2))
    core.handle(RolloutDone("a", 0))

    actions = core.handle(TaskFailed("b", "boom"))

    assert actions == [FinishTask("b", failed=True, reason="boom"), StartTrain("a", 0)]


def test_sync_a_late_arrival_trains_its_earlier_round_past_the_queue():
    """A task arriving at round 0 while round 1 runs: the others' round waits
    for it (barrier), so its batch must train although round 1's queued batch is
    ahead of it in the queue (holding it there deadlocked the core)."""
    core = SchedulerCore(mode="sync", max_rolling=1)
    core.handle(Submitted("b", 2))
    core.handle(Submitted("d", 2))
    for event in (RolloutDone("b", 0), RolloutDone("d", 0), TrainDone("b", 1)):
        core.handle(event)
    for event in (PublishDone("b", 1), TrainDone("d", 1), PublishDone("d", 1)):
        core.handle(event)
    # Round 1: b rolls out, d waits for the cap; a arrives at version 0.
    assert core.handle(Submitted("a", 1)) == [
        HoldRollout("d", 1, "barrier"),
        HoldRollout("a", 0, "cap"),
    ]
    assert core.handle(RolloutDone("b", 1)) == [StartRollout("a", 0)]

    # b's round-1 batch waits for d's rollout, d for a: a's batch goes first.
    assert core.handle(RolloutDone("a", 0)) == [StartTrain("a", 0, 0)]
    assert core.handle(TrainDone("a", 1)) == [StartPublish("a", 1)]
    assert core.handle(PublishDone("a", 1)) == [FinishTask("a"), StartRollout("d", 1)]
    assert core.handle(RolloutDone("d", 1)) == [StartTrain("b", 1, 0)]


# -- single-task baselines ------------------------------------------------------
@pytest.mark.parametrize("mode", ["sequential", "collocated"])
@settings(max_examples=60, deadline=None)
@given(
    steps=st.dictionaries(
        st.sampled_from(["a", "b", "c", "d"]), st.integers(0, 3), min_size=1
    ),
    seed=st.integers(0, 10**6),
)
def test_single_task_modes_never_overlap_two_tasks(mode, steps, seed):
    core = SchedulerCore(mode=mode)

    def one_task(core, action, in_flight):
        busy = {a.task for a in in_flight if not isinstance(a, FinishTask)}
        assert busy <= {action.task}, (action, in_flight)

    log, max_rolling = drive(core, steps, seed, check=one_task)

    assert core.finished() and max_rolling <= 1
    # Each task runs as one block, in submission order.
    order = [a.task for a in log if isinstance(a, StartRollout | StartTrain)]
    blocks = [t for i, t in enumerate(order) if i == 0 or order[i - 1] != t]
    assert blocks == [t for t in steps if steps[t] > 0]


# -- admission ------------------------------------------------------------------
def test_multi_lora_off_rolls_out_one_task_at_a_time():
    core = SchedulerCore(max_rolling=1)

    _, max_rolling = drive(core, {t: 2 for t in "abc"}, seed=3)

    assert max_rolling == 1 and core.finished()


def test_live_kv_usage_holds_admission_until_it_drops():
    core = SchedulerCore(kv_budget=100)
    core.handle(KVUsage(80))

    assert core.handle(Submitted("a", 1, kv_bytes=30)) == [HoldRollout("a", 0, "kv")]
    assert core.handle(KVUsage(70)) == [StartRollout("a", 0)]


def test_hold_is_emitted_once_per_wait():
    core = SchedulerCore(kv_budget=100)
    core.handle(Submitted("a", 2, kv_bytes=60))
    assert core.handle(Submitted("b", 1, kv_bytes=60)) == [HoldRollout("b", 0, "kv")]

    assert core.handle(KVUsage(10)) == []  # still held: no second hold record


def test_two_train_slots_train_two_tasks_at_once():
    core = SchedulerCore(trainers=2)
    for t in "abc":
        core.handle(Submitted(t, 1))
    assert core.handle(RolloutDone("a", 0)) == [StartTrain("a", 0, trainer=0)]
    assert core.handle(RolloutDone("b", 0)) == [StartTrain("b", 0, trainer=1)]
    assert core.handle(RolloutDone("c", 0)) == []
    assert core.training == {"a": 0, "b": 1}
    # Unplaced tasks take whichever trainer frees up first.
    assert core.handle(TrainDone("b", 1)) == [
        StartPublish("b", 1),
        StartTrain("c", 0, trainer=1),
    ]


def test_a_placed_task_trains_only_on_its_trainer_and_lets_others_pass():
    """a and b live on trainer 0, c on trainer 1: with trainer 0 busy, b's batch
    waits for it and c's, queued after b's, goes to the idle trainer 1."""
    core = SchedulerCore(trainers=2)
    for task, trainer in (("a", 0), ("b", 0), ("c", 1)):
        core.handle(Submitted(task, 2, trainer=trainer))
    assert core.handle(RolloutDone("a", 0)) == [StartTrain("a", 0, trainer=0)]
    assert core.handle(RolloutDone("b", 0)) == []  # trainer 1 is free, not b's
    assert core.handle(RolloutDone("c", 0)) == [StartTrain("c", 0, trainer=1)]
    assert core.handle(TrainDone("c", 1)) == [StartPublish("c", 1)]
    assert core.handle(TrainDone("a", 1)) == [
        StartPublish("a", 1),
        StartTrain("b", 0, trainer=0),
    ]
    assert core.training == {"b": 0}


def test_a_placement_outside_the_trainers_is_refused():
    core = SchedulerCore(trainers=2)
    with pytest.raises(ProtocolError, match="placed on trainer 2, but there are 2"):
        core.handle(Submitted("a", 1, trainer=2))


@settings(max_examples=200, deadline=None)
@given(
    steps=TASK_STEPS, seed=SEEDS, order=st.sampled_from(["fifo", "first_steps", "fair"])
)
def test_placed_tasks_on_two_trainers_any_event_order(steps, seed, order):
    core = SchedulerCore(trainers=2, train_order=order)
    placed = {task: i % 2 for i, task in enumerate(sorted(steps))}

    def check(core, action, pending):
        if isinstance(action, StartTrain):
            assert action.trainer == placed[action.task]
        # A trainer runs one step at a time; none idles while a batch of its
        # tasks waits in the queue.
        busy = list(core.training.values())
        assert len(busy) == len(set(busy))
        for task in core.train_queue:
            assert placed[task] in busy

    log, _ = drive(core, steps, seed, check=check, placed=placed)

    assert core.finished()
    for task, n in steps.items():
        trained = [
            a.version for a in log if isinstance(a, StartTrain) and a.task == task
        ]
        assert trained == list(range(n))


# -- retries ----------------------------------------------------------------------
def test_failed_rollout_is_retried_at_the_same_version():
    core = SchedulerCore(task_retries=1)
    core.handle(Submitted("a", 2))

    assert core.handle(TaskError("a", "server down")) == [StartRollout("a", 0)]
    assert core.handle(TaskError("a", "server down")) == [
        FinishTask("a", failed=True, reason="server down (failed 2x at v0)")
    ]


def test_failed_train_step_frees_the_trainer_and_rolls_out_again():
    core = SchedulerCore(task_retries=2)
    for t in "ab":
        core.handle(Submitted(t, 1))
    core.handle(RolloutDone("a", 0))
    core.handle(RolloutDone("b", 0))

    actions = core.handle(TaskError("a", "nan loss"))

    assert actions == [StartTrain("b", 0), StartRollout("a", 0)]


def test_failed_publish_is_retried_and_a_commit_resets_the_count():
    core = SchedulerCore(task_retries=1)
    core.handle(Submitted("a", 3))
    core.handle(RolloutDone("a", 0))
    core.handle(TrainDone("a", 1))
    assert core.handle(TaskError("a", "load failed")) == [StartPublish("a", 1)]
    core.handle(PublishDone("a", 1))
    core.handle(RolloutDone("a", 1))
    core.handle(TrainDone("a", 2))

    # One error per version is within the limit again after the commit.
    assert core.handle(TaskError("a", "load failed")) == [StartPublish("a", 2)]


@settings(max_examples=100, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    mode=st.sampled_from(["async", "sync", "sequential"]),
    errs=st.integers(0, 2),
)
def test_retried_errors_within_the_limit_still_finish_every_task(seed, mode, errs):
    core = SchedulerCore(mode=mode, task_retries=2)

    drive(core, {t: 2 for t in "abc"}, seed, errors={"b": errs})

    assert all(t.phase == "done" and t.version == 2 for t in core.tasks.values())


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="scheduler mode must be one of"):
        SchedulerCore(mode="fast")


# -- evals -----------------------------------------------------------------------


def finish(core: SchedulerCore, task: str, version: int) -> list:
    """Roll out, train and publish ``task`` at ``version``: the publish's actions."""
    core.handle(RolloutDone(task, version))
    core.handle(TrainDone(task, version + 1))
    return core.handle(PublishDone(task, version + 1))


def test_an_eval_runs_beside_the_next_rollout_and_the_last_one_ends_the_task():
    core = SchedulerCore()
    assert core.handle(Submitted("a", 3, eval_every=2)) == [StartRollout("a", 0)]
    assert finish(core, "a", 0) == [StartRollout("a", 1)]  # v1: no eval
    assert finish(core, "a", 1) == [StartEval("a", 2), StartRollout("a", 2)]
    assert finish(core, "a", 2) == [StartEval("a", 3)]  # the last version
    assert core.tasks["a"].phase.value == "eval" and not core.finished()
    assert core.handle(EvalDone("a", 2)) == []
    assert core.handle(EvalDone("a", 3)) == [FinishTask("a")]
    assert core.finished()


def test_an_eval_that_does_not_fit_waits_and_rollouts_do_not_overtake_it():
    core = SchedulerCore(kv_budget=10)
    core.handle(Submitted("a", 2, kv_bytes=6, eval_every=1, eval_kv_bytes=6))
    core.handle(Submitted("b", 2, kv_bytes=4))
    core.handle(RolloutDone("a", 0))
    core.handle(TrainDone("a", 1))
    # b rolls out (4); a's eval (6) fits beside it, a's next rollout does not.
    assert core.handle(PublishDone("a", 1)) == [
        StartEval("a", 1),
        HoldRollout("a", 1, HoldReason.KV),
    ]
    assert core.kv_in_use() == 10
    assert core.handle(RolloutDone("b", 0)) == [StartTrain("b", 0, 0)]
    assert core.handle(EvalDone("a", 1)) == [StartRollout("a", 1)]


def test_a_queued_eval_holds_later_rollouts_back():
    core = SchedulerCore(kv_budget=10)
    core.handle(Submitted("a", 2, kv_bytes=4, eval_every=1, eval_kv_bytes=8))
    core.handle(Submitted("b", 2, kv_bytes=4))
    core.handle(RolloutDone("a", 0))
    core.handle(TrainDone("a", 1))
    out = core.handle(PublishDone("a", 1))  # b rolls out: 4 + 8 > 10
    assert StartEval("a", 1) not in out
    assert out == [HoldRollout("a", 1, HoldReason.KV)]
    # b's KV frees: the eval goes; a's rollout (4 + 8 > 10) still waits.
    assert core.handle(RolloutDone("b", 0)) == [
        StartTrain("b", 0, 0),
        StartEval("a", 1),
    ]


def test_cancel_drops_a_queued_eval_and_a_running_one_frees_its_kv():
    core = SchedulerCore(kv_budget=10)
    core.handle(Submitted("a", 3, kv_bytes=4, eval_every=1, eval_kv_bytes=4))
    finish(core, "a", 0)  # eval v1 and rollout v1 both run
    assert core.kv_in_use() == 8
    core.handle(Cancel("a"))
    assert core.handle(RolloutDone("a", 1))[0].cancelled
    assert core.handle(EvalDone("a", 1)) == []
    assert core.kv_in_use() == 0 and core.finished()
    with pytest.raises(ProtocolError, match="no eval of v1"):
        core.handle(EvalDone("a", 1))


def test_an_eval_larger_than_the_budget_is_refused_at_submission():
    with pytest.raises(AdmissionError, match="lower eval_samples"):
        SchedulerCore(kv_budget=10).handle(Submitted("a", 1, eval_kv_bytes=11))


def test_a_resumed_task_does_not_evaluate_the_version_it_resumed_at():
    core = SchedulerCore()
    assert core.handle(Submitted("a", 4, version=2, eval_every=2)) == [
        StartRollout("a", 2)
    ]
    assert finish(core, "a", 2) == [StartRollout("a", 3)]
    assert finish(core, "a", 3) == [StartEval("a", 4)]


@pytest.mark.parametrize("mode", ["async", "sync", "sequential"])
@given(steps=TASK_STEPS, seed=SEEDS, every=st.integers(1, 3))
@settings(max_examples=60, deadline=None)
def test_evals_any_event_order_every_due_version_once_and_every_task_ends(
    mode, steps, seed, every
):
    core = SchedulerCore(mode=mode, kv_budget=12)
    kv = {t: 5 for t in steps}
    log, _ = drive(core, steps, seed, kv=kv, eval_every=every)
    evals = sorted((a.task, a.version) for a in log if isinstance(a, StartEval))
    due = sorted(
        (t, v)
        for t, n in steps.items()
        for v in range(1, n + 1)
        if v % every == 0 or v == n
    )
    assert evals == due
    assert core.finished() and core.kv_in_use() == 0
    assert {a.task for a in log if isinstance(a, FinishTask)} == set(steps)


# -- tasks that need no rollout (supervised) --------------------------------------
@pytest.mark.parametrize("mode", ["async", "sync", "sequential"])
@settings(max_examples=60, deadline=None)
@given(steps=TASK_STEPS, seed=SEEDS, n_train_only=st.integers(0, 4))
def test_train_only_tasks_never_roll_out_and_every_task_finishes(
    mode, steps, seed, n_train_only
):
    core = SchedulerCore(mode=mode, kv_budget=10, max_rolling=1)
    train_only = set(sorted(steps)[:n_train_only])

    def one_task(core, action, in_flight):  # the single-task modes' promise
        busy = {a.task for a in in_flight if not isinstance(a, FinishTask)}
        assert mode != "sequential" or busy <= {action.task}, (action, in_flight)

    log, _ = drive(
        core,
        steps,
        seed,
        kv={t: 10 for t in steps},
        train_only=train_only,
        check=one_task,
    )

    assert core.finished()
    for task, n in steps.items():
        assert core.tasks[task].version == n and core.tasks[task].phase == "done"
        trained = [
            a.version for a in log if isinstance(a, StartTrain) and a.task == task
        ]
        assert trained == list(range(n))


def test_a_train_only_task_trains_while_the_budget_holds_every_rollout():
    core = SchedulerCore(kv_budget=10)
    core.handle(Submitted("rl", 2, kv_bytes=10))  # takes the whole budget

    actions = core.handle(Submitted("sft", 2, kv_bytes=0, rollout=False))

    assert actions == [StartTrain("sft", 0)]
    assert core.tasks["rl"].phase == "rollout"


def test_a_train_only_task_shares_the_fifo_queue_with_rollout_batches():
    core = SchedulerCore()
    core.handle(Submitted("rl", 2))
    core.handle(Submitted("sft", 2, rollout=False))  # trains v0 now
    core.handle(RolloutDone("rl", 0))  # queued behind sft's step

    actions = core.handle(TrainDone("sft", 1))

    assert actions == [StartPublish("sft", 1), StartTrain("rl", 0)]
    # Published, the train-only task queues again behind rl's step in training.
    assert core.handle(PublishDone("sft", 1)) == []
    assert core.handle(TrainDone("rl", 1)) == [
        StartPublish("rl", 1),
        StartTrain("sft", 1),
    ]


def test_pausing_a_queued_train_only_task_stops_it_at_once_and_resume_requeues():
    core = SchedulerCore()
    core.handle(Submitted("rl", 2))
    core.handle(RolloutDone("rl", 0))  # training
    core.handle(Submitted("sft", 2, rollout=False))  # queued behind it

    paused = core.handle(Pause("sft"))

    assert paused == [TaskPaused("sft", 0)]
    assert core.handle(TrainDone("rl", 1)) == [StartPublish("rl", 1)]
    assert core.handle(Resume("sft")) == [StartTrain("sft", 0)]
