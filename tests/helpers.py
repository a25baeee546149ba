"""Snapshot and comparison helpers shared by the training tests."""

from __future__ import annotations

import torch


def lora_snapshot(engine, task: str) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in engine.adapter_state(task).items()}


def optimizer_snapshot(engine, task: str) -> list[dict]:
    opt = engine.slots[task].optimizer
    return [
        {k: v.clone() if torch.is_tensor(v) else v for k, v in opt.state[p].items()}
        for group in opt.param_groups
        for p in group["params"]
    ]


def assert_bitwise_equal(a, b) -> None:
    assert type(a) is type(b)
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_bitwise_equal(a[k], b[k])
    elif isinstance(a, list):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_bitwise_equal(x, y)
    elif torch.is_tensor(a):
        assert torch.equal(a, b)
    else:
        assert a == b
