"""How much of the agents' tool time other tenants' work hid (the paper's
overlap of environment interaction), from a run directory's phase intervals.

A task's tool time is the union of its ``env`` intervals (the tool calls of its
rollouts, awaited off the event loop). It is hidden where another task worked
meanwhile: trained, or generated (its ``rollout`` intervals less its own
``env`` ones, which are waits too). The trainer's busy share is the union of
every ``train`` interval over the window."""

from __future__ import annotations

from typing import Any

from areal_marlaas.bench.fairness import Interval, intersect
from areal_marlaas.bench.fairness import union as merged


def length(spans: list[Interval]) -> float:
    return sum(e - s for s, e in spans)


def subtract(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """Spans of ``a`` outside ``b`` (each argument merged)."""
    out: list[Interval] = []
    for s, e in a:
        cur = s
        for bs, be in b:
            if be <= cur or bs >= e:
                continue
            if bs > cur:
                out.append((cur, bs))
            cur = max(cur, be)
        if cur < e:
            out.append((cur, e))
    return out


def tool_overlap(
    phases: list[dict[str, Any]], window: Interval | None = None
) -> dict[str, Any]:
    """``tool_s`` (every task's tool time, summed), ``tool_hidden_s`` and
    ``tool_hidden_share`` (the part other tasks' work overlapped),
    ``tool_behind_training_share`` (the part the trainer trained others), and
    with ``window`` the trainer's busy share ``train_busy_share``. Empty
    without tool time or a window."""
    by: dict[str, dict[str, list[Interval]]] = {}
    for e in phases:
        spans = by.setdefault(e["task"], {}).setdefault(e["phase"], [])
        spans.append((float(e["start"]), float(e["end"])))
    env = {t: merged(p.get("env", [])) for t, p in by.items()}
    train = {t: merged(p.get("train", [])) for t, p in by.items()}
    work = {
        t: merged([*train[t], *subtract(merged(p.get("rollout", [])), env[t])])
        for t, p in by.items()
    }
    out: dict[str, Any] = {}
    total = sum(length(s) for s in env.values())
    if total > 0:
        hidden = behind = 0.0
        for t, spans in env.items():
            others = merged(s for u, w in work.items() if u != t for s in w)
            trained = merged(s for u, w in train.items() if u != t for s in w)
            hidden += length(intersect(spans, others))
            behind += length(intersect(spans, trained))
        out.update(
            {
                "tool_s": total,
                "tool_hidden_s": hidden,
                "tool_hidden_share": hidden / total,
                "tool_behind_training_share": behind / total,
            }
        )
    if window is not None and window[1] > window[0]:
        busy = intersect(merged(s for w in train.values() for s in w), [window])
        out["train_busy_share"] = length(busy) / (window[1] - window[0])
    return out
