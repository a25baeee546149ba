"""The engine's side of fault tolerance on a tiny CPU model: a non-finite step is
rolled back and raised, and a task resumed from ``optimizer.pt`` continues the
same optimization bit for bit."""

from __future__ import annotations

import pytest
import torch

from areal_marlaas.train.engine import TASK_STATE, NonFiniteUpdateError

from .helpers import assert_bitwise_equal, lora_snapshot, optimizer_snapshot
from .test_train_engine import make_engine, ragged_batch
from .test_train_engine import single_rank_env as single_rank_env  # noqa: F401
from .test_train_engine import tiny as tiny  # noqa: F401


def test_nan_loss_restores_weights_and_optimizer_and_raises(tiny):  # noqa: F811
    engine = make_engine(tiny["llama"])
    engine.add_task("a", lr=1e-2, total_steps=5, n_samples=2, seed=1)
    engine.train_task("a", [ragged_batch([9, 12], seed=1)])
    weights, optim = lora_snapshot(engine, "a"), optimizer_snapshot(engine, "a")
    lr = engine.slots["a"].optimizer.param_groups[0]["lr"]
    poisoned = ragged_batch([9, 12], seed=2, version=1)
    poisoned["rewards"] = torch.tensor([float("nan"), 1.0])

    with pytest.raises(NonFiniteUpdateError, match="task 'a' v1: non-finite"):
        engine.train_task("a", [poisoned])

    assert_bitwise_equal(lora_snapshot(engine, "a"), weights)
    assert_bitwise_equal(optimizer_snapshot(engine, "a"), optim)
    assert engine.slots["a"].version == 1
    assert engine.slots["a"].optimizer.param_groups[0]["lr"] == lr  # no LR step
    # The retried step (good data) goes through.
    engine.train_task("a", [ragged_batch([9, 12], seed=3, version=1)])
    assert engine.slots["a"].version == 2


def test_task_resumed_from_saved_state_continues_identically(tiny, tmp_path):  # noqa: F811
    engine = make_engine(tiny["llama"])
    engine.add_task("a", lr=1e-2, total_steps=5, n_samples=2, seed=1)
    engine.train_task("a", [ragged_batch([9, 12], seed=1)])
    folder = tmp_path / "v1"
    engine.save_adapter("a", folder)
    engine.save_task_state("a", folder)

    # "b" is task "a" after a crash: its v1 adapter and optimizer.pt.
    engine.add_task(
        "b", lr=1e-2, total_steps=5, n_samples=2, seed=7, init_adapter=folder, version=1
    )

    assert (folder / TASK_STATE).is_file()
    assert_bitwise_equal(
        optimizer_snapshot(engine, "b"), optimizer_snapshot(engine, "a")
    )
    sched = [engine.slots[t].lr_scheduler.state_dict()["last_epoch"] for t in "ab"]
    assert sched == [1, 1]
    batch = ragged_batch([10, 7], seed=4, version=1)
    engine.train_task("a", [batch])
    engine.train_task("b", [batch])
    assert_bitwise_equal(lora_snapshot(engine, "b"), lora_snapshot(engine, "a"))
    assert_bitwise_equal(
        optimizer_snapshot(engine, "b"), optimizer_snapshot(engine, "a")
    )
