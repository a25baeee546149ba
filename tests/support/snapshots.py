"""Snapshots and bitwise comparisons of adapters, optimizer states and
trajectories."""

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
        for x, y in zip(a, b, strict=True):
            assert_bitwise_equal(x, y)
    elif torch.is_tensor(a):
        assert torch.equal(a, b)
    else:
        assert a == b


def trajectory_summary(traj) -> dict:
    """Plain-Python view of one (possibly grouped) trajectory."""
    mask = traj["loss_mask"].bool()
    out = []
    for i in range(traj["input_ids"].shape[0]):
        m = mask[i]
        out.append(
            {
                "output_ids": traj["input_ids"][i][m].tolist(),
                "logprobs": traj["logprobs"][i][m].tolist(),
                "versions": sorted(set(traj["versions"][i][m].tolist())),
                "reward": float(traj["rewards"][i]),
            }
        )
    return {"task": traj.get("task"), "samples": out}


def ok(item) -> bool:
    """A trajectory, not a failed episode's marker (or None)."""
    from areal_marlaas.trajectory import failure_reason

    return item is not None and failure_reason(item) is None
