"""``marlaas bench-learning``: does a task learn, and does it learn the same among
other tenants?

Runs the config's first task alone, then all of the config's tasks together (same
seeds, so the first task sees the same prompts in the same order), and compares
the first task's reward per step: a table, a PNG plot and JSON.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path
from typing import Any

from areal_marlaas.config import MARLaaSConfig
from areal_marlaas.metrics.runlog import rewards_of
from areal_marlaas.train.screen import format_summary
from areal_marlaas.train.trainer import MultiTaskTrainer


def trend(rewards: list[float], window: int = 5) -> dict[str, float]:
    """First-window vs last-window mean and the least-squares slope per step."""
    n = len(rewards)
    xs = range(n)
    mx, my = (n - 1) / 2, statistics.fmean(rewards)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, rewards)) / max(
        sum((x - mx) ** 2 for x in xs), 1e-9
    )
    return {
        "first_mean": statistics.fmean(rewards[:window]),
        "last_mean": statistics.fmean(rewards[-window:]),
        "slope_per_step": slope,
    }


def compare(alone: list[float], mixed: list[float]) -> dict[str, float]:
    """How far apart the curves are, against the step-to-step noise of each."""
    n = min(len(alone), len(mixed))
    diffs = [m - a for a, m in zip(alone[:n], mixed[:n])]

    def noise(xs: list[float]) -> float:
        return statistics.pstdev([b - a for a, b in zip(xs, xs[1:])]) / 2**0.5

    return {
        "mean_diff": statistics.fmean(diffs),
        "mean_abs_diff": statistics.fmean(abs(d) for d in diffs),
        "diff_stderr": statistics.pstdev(diffs) / n**0.5 if n > 1 else float("nan"),
        "step_noise_alone": noise(alone[:n]),
        "step_noise_mixed": noise(mixed[:n]),
    }


def plot(alone: list[float], mixed: list[float], task: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(range(1, len(alone) + 1), alone, "o-", label=f"{task} alone")
    ax.plot(range(1, len(mixed) + 1), mixed, "s-", label=f"{task} among tenants")
    ax.set_xlabel("training step (committed version)")
    ax.set_ylabel("batch reward mean")
    ax.set_title(f"GRPO learning curve of {task}: alone vs multi-tenant")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def bench_learning(cfg: MARLaaSConfig, out_dir: Path) -> dict[str, Any]:
    target = cfg.tasks[0].name
    runs = {}
    for label, tasks in (("alone", cfg.tasks[:1]), ("mixed", cfg.tasks)):
        run_cfg = dataclasses.replace(
            cfg, trial_name=f"{cfg.trial_name}-{label}", tasks=list(tasks)
        )
        summary = MultiTaskTrainer(run_cfg).run()
        print(format_summary(summary), flush=True)
        runs[label] = summary
    alone = rewards_of(runs["alone"]["run_dir"], target)
    mixed = rewards_of(runs["mixed"]["run_dir"], target)
    out_dir.mkdir(parents=True, exist_ok=True)
    png = out_dir / "learning_curve.png"
    plot(alone, mixed, target, png)
    result = {
        "task": target,
        "rewards": {"alone": alone, "mixed": mixed},
        "trend": {"alone": trend(alone), "mixed": trend(mixed)},
        "compare": compare(alone, mixed),
        "runs": {
            k: {"run_dir": v["run_dir"], "wall_s": v["wall_s"]} for k, v in runs.items()
        },
        "plot": str(png),
    }
    (out_dir / "learning.json").write_text(json.dumps(result, indent=2))
    return result


def format_learning(result: dict[str, Any]) -> str:
    alone, mixed = result["rewards"]["alone"], result["rewards"]["mixed"]
    lines = [f"{'step':>5} {'alone':>8} {'mixed':>8}"]
    for i in range(max(len(alone), len(mixed))):
        a = f"{alone[i]:.3f}" if i < len(alone) else "-"
        m = f"{mixed[i]:.3f}" if i < len(mixed) else "-"
        lines.append(f"{i + 1:>5} {a:>8} {m:>8}")
    for label in ("alone", "mixed"):
        t = result["trend"][label]
        lines.append(
            f"{label}: first-5 mean {t['first_mean']:.3f} -> last-5 mean "
            f"{t['last_mean']:.3f}, slope {t['slope_per_step']:+.4f}/step"
        )
    c = result["compare"]
    lines.append(
        f"mixed - alone: mean {c['mean_diff']:+.3f} +- {c['diff_stderr']:.3f} "
        "(stderr), "
        f"step noise {c['step_noise_alone']:.3f} / {c['step_noise_mixed']:.3f}"
    )
    lines.append(f"plot: {result['plot']}")
    return "\n".join(lines)


def evaluate_adapters(
    cfg: MARLaaSConfig, adapters: dict[str, str], prompts: int, samples: int = 2
) -> dict[str, float]:
    """Mean reward of each adapter on held-out prompts of the config's first task
    (same kind, another seed), at the task's temperature."""
    from areal_marlaas.rollout.session import RolloutSession
    from areal_marlaas.tasks import load_task_rows
    from areal_marlaas.trajectory import failure_reason
    from areal_marlaas.workflows import task_workflow

    base = cfg.tasks[0]
    held_out = dataclasses.replace(base, seed=base.seed + 10_000)
    rows = load_task_rows(held_out)[:prompts]
    out = {}
    with RolloutSession(cfg, Path(cfg.cluster.fileroot) / "eval") as session:
        for i, (label, path) in enumerate(adapters.items()):
            name = f"eval{i}_{base.name}"
            session.engine.register_task(name, 0, path)
            spec = dataclasses.replace(base, name=name)
            workflow, kwargs = task_workflow(spec, cfg.tokenizer_path)
            trajs = session.engine.rollout_task(rows, workflow, kwargs, samples)
            rewards = [
                float(r)
                for t in trajs
                if t is not None and failure_reason(t) is None
                for r in t["rewards"]
            ]
            out[label] = statistics.fmean(rewards)
    return out
