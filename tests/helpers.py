"""Snapshot and comparison helpers shared by the training tests."""

from __future__ import annotations

import time

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


class LeaseLog:
    """A registry listener that keeps every lease, publish and retire (tests read
    what the product no longer stores)."""

    def __init__(self):
        self.leases: list[list] = []  # [name, start, end]
        self.published_at: dict[str, float] = {}
        self.retired_at: dict[str, float] = {}
        self._open: dict[str, list[list]] = {}

    def leased(self, name: str, start: float) -> None:
        rec = [name, start, None]
        self.leases.append(rec)
        self._open.setdefault(name, []).append(rec)

    def released(self, name: str, end: float) -> None:
        self._open[name].pop(0)[2] = end

    def published(self, name: str, at: float) -> None:
        self.published_at[name] = at

    def retired(self, name: str, at: float) -> None:
        self.retired_at[name] = at

    def inflight(self, name: str) -> int:
        return len(self._open.get(name, []))


def ok(item) -> bool:
    """A trajectory, not a failed episode's marker (or None)."""
    from areal_marlaas.trajectory import failure_reason

    return item is not None and failure_reason(item) is None


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_for(cond, timeout: float, step: float = 0.1) -> float:
    """Poll ``cond`` until true; the seconds it took (AssertionError at timeout)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if cond():
            return time.monotonic() - t0
        time.sleep(step)
    raise AssertionError(f"condition not met within {timeout}s")
