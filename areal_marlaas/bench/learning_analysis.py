"""What the learning bench concludes from its runs: held-out gains alone and
together with their intervals, the together-minus-alone difference, time to a
target held-out reward and time until every tenant is done, together against
the sequential baseline, and the audit of every committed step.

Pure: the inputs are the runs' records (evals, steps, wall-clock) and the base
accuracies; ``learning.py`` gathers them, ``learning_report.py`` prints them.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from areal_marlaas.adapters import adapter_name
from areal_marlaas.bench.time_to_quality import (
    Point,
    curve,
    excludes_zero,
    gain,
    mean_ci,
    mean_start_over_orders,
    ratio,
    sequential_starts,
    target,
    time_to,
)


def alone_label(seed: int, task: str) -> str:
    return f"s{seed}-alone-{task}"


def together_label(seed: int) -> str:
    return f"s{seed}-together"


def audit(steps: Sequence[Mapping[str, Any]], max_mean_gap: float) -> dict[str, Any]:
    """Every committed step: served by the adapter of the version it trained
    (``<task>-v<version - 1>``, as the server reported it) and a mean logprob
    gap under ``max_mean_gap``."""
    wrong = [
        f"{s['task']} v{s['version']}"
        for s in steps
        if s.get("served_adapters") != [adapter_name(s["task"], s["version"] - 1)]
    ]
    gaps = [
        s["logprob_gap_mean"] for s in steps if s.get("logprob_gap_mean") is not None
    ]
    over = [g for g in gaps if max_mean_gap and g > max_mean_gap]
    return {
        "steps": len(steps),
        "audited_steps": len(gaps),
        "gap_mean": statistics.fmean(gaps) if gaps else None,
        "gap_max": max(gaps) if gaps else None,
        "limit": max_mean_gap,
        "over_limit": len(over),
        "served_other": wrong,
        "holds": bool(steps) and not over and not wrong and len(gaps) == len(steps),
    }


def analyse(
    tasks: Sequence[str],
    seeds: Sequence[int],
    runs: Mapping[str, Mapping[str, Any]],
    bases: Mapping[int, Mapping[str, float]],
    target_fraction: float,
) -> dict[str, Any]:
    """``runs[label]``: ``{"t0", "wall_s", "evals", "steps"}`` of each run
    (labels of ``alone_label`` / ``together_label``); ``bases[seed][task]``:
    the base held-out reward on that seed's eval rows."""
    curves: dict[str, dict[str, dict[int, list[Point]]]] = {
        c: {t: {} for t in tasks} for c in ("alone", "together")
    }
    for seed in seeds:
        for t in tasks:
            base = bases[seed][t]
            a = runs[alone_label(seed, t)]
            curves["alone"][t][seed] = curve(a["evals"], t, a["t0"], base)
            g = runs[together_label(seed)]
            curves["together"][t][seed] = curve(g["evals"], t, g["t0"], base)

    per_task: dict[str, Any] = {}
    for t in tasks:
        alone = [gain(curves["alone"][t][s]) for s in seeds]
        together = [gain(curves["together"][t][s]) for s in seeds]
        diff = [b - a for a, b in zip(alone, together, strict=True)]
        a_ci, g_ci, d_ci = mean_ci(alone), mean_ci(together), mean_ci(diff)
        per_task[t] = {
            "base": mean_ci([bases[s][t] for s in seeds]),
            "gain_alone": {
                **a_ci,
                "per_seed": alone,
                "excludes_0": excludes_zero(a_ci),
            },
            "gain_together": {
                **g_ci,
                "per_seed": together,
                "excludes_0": excludes_zero(g_ci),
            },
            "together_minus_alone": {
                **d_ci,
                "per_seed": diff,
                "excludes_0": excludes_zero(d_ci),
            },
            "targets": {s: target(bases[s][t], alone, target_fraction) for s in seeds},
        }

    timing = _timing(tasks, seeds, runs, curves, per_task)
    return {"curves": curves, "per_task": per_task, "timing": timing}


def _timing(tasks, seeds, runs, curves, per_task) -> dict[str, Any]:
    """Time to target and until all are done: together, sequential in the
    configured order, and sequential averaged over every order."""
    rows: dict[str, Any] = {t: {"per_seed": []} for t in tasks}
    all_done = []
    for seed in seeds:
        durations = {t: runs[alone_label(seed, t)]["wall_s"] for t in tasks}
        starts = sequential_starts(durations, list(tasks))
        together_wall = runs[together_label(seed)]["wall_s"]
        seq_wall = sum(durations.values())
        all_done.append(
            {
                "seed": seed,
                "together_s": together_wall,
                "sequential_s": seq_wall,
                "ratio": ratio(together_wall, seq_wall),
            }
        )
        for t in tasks:
            bar = per_task[t]["targets"][seed]
            alone_t = time_to(curves["alone"][t][seed], bar)
            rows[t]["per_seed"].append(
                {
                    "seed": seed,
                    "target": bar,
                    "together_s": time_to(curves["together"][t][seed], bar),
                    "alone_s": alone_t,
                    "sequential_s": None if alone_t is None else starts[t] + alone_t,
                    "sequential_any_order_s": None
                    if alone_t is None
                    else mean_start_over_orders(durations, t) + alone_t,
                }
            )
    for t in tasks:
        per = rows[t]["per_seed"]
        for key, out in (
            ("sequential_s", "ratio_to_sequential"),
            ("sequential_any_order_s", "ratio_to_sequential_any_order"),
        ):
            ratios = [ratio(p["together_s"], p[key]) for p in per]
            got = [r for r in ratios if r is not None]
            rows[t][out] = {**mean_ci(got), "of_seeds": len(got)}
    ratios = [r["ratio"] for r in all_done if r["ratio"] is not None]
    return {
        "time_to_target": rows,
        "all_done": {"per_seed": all_done, "ratio": mean_ci(ratios)},
    }
