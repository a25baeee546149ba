"""``marlaas report RUN_DIR``: time per phase (wait, rollout, queue, train, publish)
per task, from ``events.jsonl``. ``wait`` is time ready to roll out but held by
admission, a sync barrier or a single-task turn."""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

from areal_marlaas.rundir.reader import PHASES, phase_records, read_jsonl


def phase_stats(run_dir: str | Path) -> dict[str, dict[str, dict[str, float]]]:
    """``{task: {phase: {"n", "mean_s", "p50_s", "max_s"}}}`` (plus task "all")."""
    durations: dict[str, dict[str, list[float]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for e in phase_records(read_jsonl(Path(run_dir) / "events.jsonl")):
        d = e["end"] - e["start"]
        durations[e["task"]][e["phase"]].append(d)
        durations["all"][e["phase"]].append(d)
    return {
        task: {
            phase: {
                "n": len(xs),
                "mean_s": statistics.fmean(xs),
                "p50_s": statistics.median(xs),
                "max_s": max(xs),
            }
            for phase, xs in phases.items()
        }
        for task, phases in durations.items()
    }


def format_phase_stats(stats: dict) -> str:
    lines = [
        f"{'task':<12} {'phase':<8} {'n':>4} {'mean_s':>8} {'p50_s':>8} {'max_s':>8}"
    ]
    for task in sorted(stats, key=lambda t: (t == "all", t)):
        for phase in PHASES:
            if phase in stats[task]:
                s = stats[task][phase]
                lines.append(
                    f"{task:<12} {phase:<8} {s['n']:>4} {s['mean_s']:>8.2f} "
                    f"{s['p50_s']:>8.2f} {s['max_s']:>8.2f}"
                )
    return "\n".join(lines)
