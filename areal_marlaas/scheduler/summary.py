"""What a run reports at the end (``summary.json``, the screen's table)."""

from __future__ import annotations

import statistics
from itertools import pairwise
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from areal_marlaas.scheduler.runtime import Runtime


def summarize(rt: Runtime, wall: float) -> dict[str, Any]:
    tasks = {}
    steps = 0
    for name, t in rt.tasks.items():
        state = rt.core.tasks.get(name)
        gaps = [b - a for a, b in pairwise([t.submitted_at, *t.commits])]
        steps += len(t.commits)
        tasks[name] = {
            "steps": len(t.commits),
            "final_version": state.version if state else t.start_version,
            "status": state.phase.value if state else "rejected",
            "error": t.error,
            "kv_bytes": t.kv_bytes,
            "reward_first": t.rewards[0] if t.rewards else None,
            "reward_last": t.rewards[-1] if t.rewards else None,
            # The newest held-out eval: (version, reward mean or None).
            "eval_last": max(t.evals) if t.evals else None,
            "ttfs_s": gaps[0] if gaps else None,
            "tpts_p50_s": statistics.median(gaps) if gaps else None,
        }
    return {
        "mode": rt.options.mode,
        "trainers": rt.trainer_count,
        "wall_s": wall,
        "train_steps_per_hour": steps / wall * 3600 if wall > 0 else 0.0,
        "kv_budget": rt.core.kv_budget,
        "max_rolling": rt.core.max_rolling,
        "admission_holds": rt.holds,
        "kv_peak_reported": rt.kv_peak_reported,
        "tasks": tasks,
    }
