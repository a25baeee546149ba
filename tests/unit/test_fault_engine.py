"""The engine's side of fault tolerance on a tiny CPU model: a non-finite step is
rolled back and raised, and a task resumed from ``optimizer.pt`` continues the
same optimization bit for bit."""

from __future__ import annotations

import random

import pytest
import torch

from areal_marlaas.train.engine import TASK_STATE, NonFiniteUpdateError, _task_rng
from tests.support.engines import make_engine, ragged_batch
from tests.support.snapshots import (
    assert_bitwise_equal,
    lora_snapshot,
    optimizer_snapshot,
)

# The FSDP engine is built in this process, as one rank.
pytestmark = pytest.mark.usefixtures("single_rank_env")


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
    assert torch.equal(engine.slots["b"].rng["torch"], engine.slots["a"].rng["torch"])
    assert engine.slots["b"].rng["python"] == engine.slots["a"].rng["python"]
    batch = ragged_batch([10, 7], seed=4, version=1)
    engine.train_task("a", [batch])
    engine.train_task("b", [batch])
    assert_bitwise_equal(lora_snapshot(engine, "b"), lora_snapshot(engine, "a"))
    assert_bitwise_equal(
        optimizer_snapshot(engine, "b"), optimizer_snapshot(engine, "a")
    )


def test_recomputed_logprobs_make_the_step_independent_of_server_logprobs(tiny):  # noqa: F811
    engine = make_engine(tiny["llama"], recompute_logprob=True)
    batch = ragged_batch([9, 12], seed=1)
    # What another batch composition on the server does to its logprobs (~1e-5).
    noise = 1e-5 * torch.randn(batch["logprobs"].shape, generator=torch.Generator())
    nudged = dict(batch, logprobs=batch["logprobs"] + noise * batch["loss_mask"])
    for task in ("a", "b"):
        engine.add_task(task, lr=1e-2, total_steps=5, n_samples=2, seed=1)
    # The control: the same pair on the server's logprobs.
    engine.config.recompute_logprob = False
    for task in ("c", "d"):
        engine.add_task(task, lr=1e-2, total_steps=5, n_samples=2, seed=1)

    for task, data in zip("abcd", (batch, nudged, batch, nudged), strict=True):
        engine.train_task(task, [data])

    assert_bitwise_equal(lora_snapshot(engine, "b"), lora_snapshot(engine, "a"))
    c, d = lora_snapshot(engine, "c"), lora_snapshot(engine, "d")
    assert any(not torch.equal(c[k], d[k]) for k in c)


def test_task_rng_streams_are_per_task_and_leave_the_process_rng_alone(tiny):  # noqa: F811
    engine = make_engine(tiny["llama"])
    for task in ("a", "b"):
        engine.add_task(task, lr=1e-2, total_steps=5, n_samples=2, seed=1)
    torch.manual_seed(123)
    random.seed(123)
    outer = torch.get_rng_state(), random.getstate()

    with _task_rng(engine.slots["a"]):
        a1 = torch.rand(3), random.random()
    process_untouched = torch.equal(torch.get_rng_state(), outer[0])
    torch.rand(5), random.random()  # the process (other tenants) moves on
    with _task_rng(engine.slots["b"]):
        b1 = torch.rand(3), random.random()
    with _task_rng(engine.slots["a"]):
        a2 = torch.rand(3), random.random()

    assert process_untouched
    assert torch.equal(a1[0], b1[0]) and a1[1] == b1[1]  # same seed, same stream
    assert not torch.equal(a2[0], a1[0]) and a2[1] != a1[1]  # continued, not reset
