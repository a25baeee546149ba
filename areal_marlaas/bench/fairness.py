"""How fairly a run shared the trainer between tenants, from its run directory's
interval events (``queue`` and ``train`` per task): each tenant's weighted
trainer time over the window in which every tenant was backlogged (had a batch
waiting or training), Jain's index of those shares and their max/min ratio.

A tenant idle part of the time is not owed a share then, so only time when all
are backlogged counts (the judgement ``docs/research/fairness.md`` recommends).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

Interval = tuple[float, float]


def jain(values: Iterable[float]) -> float | None:
    """Jain's fairness index (sum x)^2 / (n sum x^2): 1 = equal, 1/n = one
    takes all; None for no values or all zero."""
    xs = list(values)
    sq = sum(x * x for x in xs)
    if not xs or sq == 0:
        return None
    return sum(xs) ** 2 / (len(xs) * sq)


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, disjoint intervals covering the same time."""
    out: list[Interval] = []
    for a, b in sorted(i for i in intervals if i[1] > i[0]):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def intersect(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """The time in both (each a sorted disjoint list)."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def overlap(x: Interval, window: list[Interval]) -> float:
    """Seconds of ``x`` inside ``window``."""
    return sum(max(0.0, min(x[1], b) - max(x[0], a)) for a, b in window)


def tenant_intervals(
    events: Iterable[Mapping[str, Any]], tenant_of: Mapping[str, str]
) -> tuple[dict[str, list[Interval]], dict[str, list[Interval]]]:
    """Per tenant, its backlogged intervals (a batch queued or training) and its
    training intervals, from interval events; tasks not in ``tenant_of`` are
    left out."""
    backlog: dict[str, list[Interval]] = {}
    train: dict[str, list[Interval]] = {}
    for e in events:
        tenant = tenant_of.get(str(e.get("task")))
        if tenant is None or e.get("phase") not in ("queue", "train"):
            continue
        span = (float(e["start"]), float(e["end"]))
        backlog.setdefault(tenant, []).append(span)
        if e["phase"] == "train":
            train.setdefault(tenant, []).append(span)
    return backlog, train


def fairness(
    events: Iterable[Mapping[str, Any]],
    tenant_of: Mapping[str, str],
    weights: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """Weighted trainer shares over the all-backlogged window. ``tenant_of``
    maps a task to its tenant (tasks not in it are left out); ``weights`` a
    tenant to its weight (default 1)."""
    weights = weights or {}
    backlog, train = tenant_intervals(events, tenant_of)
    tenants = sorted(set(tenant_of.values()))
    window: list[Interval] | None = None
    for t in tenants:
        mine = union(backlog.get(t, []))
        window = mine if window is None else intersect(window, mine)
    window = window or []
    served = {
        t: sum(overlap(s, window) for s in train.get(t, [])) / weights.get(t, 1.0)
        for t in tenants
    }
    total = sum(served.values())
    shares = {t: (v / total if total else 0.0) for t, v in served.items()}
    positive = [v for v in served.values() if v > 0]
    return {
        "window_s": sum(b - a for a, b in window),
        "weighted_trainer_s": served,
        "shares": shares,
        "jain": jain(served.values()),
        "max_min_ratio": (
            max(served.values()) / min(served.values())
            if len(positive) == len(served) and served
            else None
        ),
    }
