"""Held-out curves and time to quality for the learning bench: pure functions of
the runs' eval records (``evals.jsonl``) and wall-clock times.

A curve is one task's held-out reward against its committed version and the
seconds since its run's process started (set-up included: the sequential
baseline pays it once per task, the shared run once). The sequential baseline
is the alone runs one after another: a task's times there are offset by the
durations of the tasks run before it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypedDict

# Two-sided 97.5% Student t quantiles by degrees of freedom (95% CI over seeds).
_T975 = (
    (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)
    + (2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086)
    + (2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
)


def t975(df: int) -> float:
    """The 97.5% Student t quantile at ``df`` degrees of freedom: the table to
    30, then 1.96 + 2.4 / df (within 0.003 of the exact value beyond 30)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    return _T975[df - 1] if df <= len(_T975) else 1.96 + 2.4 / df


class Point(TypedDict):
    version: int
    t: float  # seconds since the run's process started
    reward: float


def mean_ci(xs: Sequence[float]) -> dict[str, float | None]:
    """Mean, sample sd and the 95% t-interval half-width over ``xs``."""
    n = len(xs)
    if n == 0:
        return {"mean": None, "sd": None, "ci95": None, "n": 0}
    mean = statistics.fmean(xs)
    sd = statistics.stdev(xs) if n > 1 else None
    half = t975(n - 1) * sd / math.sqrt(n) if sd is not None else None
    return {"mean": mean, "sd": sd, "ci95": half, "n": n}


def excludes_zero(stat: Mapping[str, float | None]) -> bool:
    """Whether a ``mean_ci`` interval lies wholly on one side of 0."""
    mean, half = stat.get("mean"), stat.get("ci95")
    return mean is not None and half is not None and abs(mean) > half


def curve(
    evals: Iterable[Mapping[str, Any]], task: str, t0: float, base: float
) -> list[Point]:
    """``task``'s held-out curve: the base (v0, at t = 0), then every eval that
    came back, in version order; ``t0``: the wall clock its run started at."""
    points: list[Point] = [{"version": 0, "t": 0.0, "reward": base}]
    done = [
        e
        for e in evals
        if e["task"] == task and e.get("reward_mean") is not None and not e.get("error")
    ]
    for e in sorted(done, key=lambda e: e["version"]):
        points.append(
            {
                "version": int(e["version"]),
                "t": float(e["end"]) - t0,
                "reward": float(e["reward_mean"]),
            }
        )
    return points


def time_to(points: Sequence[Point], target: float | None) -> float | None:
    """The first time the curve reaches ``target`` (None: never, or no target)."""
    if target is None:
        return None
    return next((p["t"] for p in points if p["reward"] >= target), None)


def gain(points: Sequence[Point]) -> float:
    """Final held-out reward minus the base."""
    return points[-1]["reward"] - points[0]["reward"]


def target(base: float, alone_gains: Sequence[float], fraction: float) -> float | None:
    """The bar a run must reach: its base plus ``fraction`` of the task's mean
    gain when trained alone (None when training alone did not gain)."""
    mean = statistics.fmean(alone_gains) if alone_gains else 0.0
    return base + fraction * mean if mean > 0 else None


def sequential_starts(
    durations: Mapping[str, float], order: Sequence[str]
) -> dict[str, float]:
    """When each task's run starts if the runs go one after another in ``order``."""
    starts, t = {}, 0.0
    for name in order:
        starts[name] = t
        t += durations[name]
    return starts


def mean_start_over_orders(durations: Mapping[str, float], task: str) -> float:
    """A task's start averaged over every order of the runs: each other run
    comes before it in half of the orders."""
    return sum(d for n, d in durations.items() if n != task) / 2


def ratio(together: float | None, sequential: float | None) -> float | None:
    if together is None or sequential is None or sequential <= 0:
        return None
    return together / sequential
