"""The learning bench's outputs: ``learning.json``, ``learning.md`` and the
plots of held-out reward against steps and against wall-clock time."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from areal.utils import logging

from areal_marlaas.fmt import fmt

logger = logging.getLogger("MARLaaSLearning")


def _ci(c: dict[str, Any], digits: int = 3) -> str:
    if c.get("mean") is None:
        return "-"
    half = "-" if c.get("ci95") is None else f"{c['ci95']:.{digits}f}"
    return f"{c['mean']:.{digits}f} [+-{half}]"


def _provenance(result: dict[str, Any]) -> list[str]:
    if not result.get("command"):
        return []
    return [f"`{result['command']}`", "", f"Machine: {result['machine']}.", ""]


def format_markdown(result: dict[str, Any]) -> str:
    seeds = result["seeds"]
    lines = [
        "# Held-out learning, alone and among tenants",
        "",
        *_provenance(result),
        f"Each task trained {result['steps']} GRPO steps alone (the runs one after "
        "another: the sequential baseline) and all together on one server and "
        f"one trainer, seeds {seeds}. Held-out reward: {result['eval_prompts']} "
        f"held-out prompts, one sample each, every {result['eval_every']} "
        "versions and after the last; the base is v0 on the same prompts. Prompt "
        f"overlap with the training side: {result['held_out_overlap']}. "
        "Intervals: 95% t over seeds.",
        "",
        "## Gains (final - base)",
        "",
        "| task | base | gain alone | gain together | together - alone "
        "| alone excludes 0 | together excludes 0 |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, t in result["per_task"].items():
        lines.append(
            f"| {name} | {_ci(t['base'])} | {_ci(t['gain_alone'])} | "
            f"{_ci(t['gain_together'])} | {_ci(t['together_minus_alone'])} | "
            f"{t['gain_alone']['excludes_0']} | {t['gain_together']['excludes_0']} |"
        )
    timing = result["timing"]
    lines += [
        "",
        f"## Time to quality (target: base + {result['target_fraction']} x the "
        "task's mean gain alone)",
        "",
        "Seconds from the run's start (set-up included); sequential = the alone "
        "runs in the configured order; any order = averaged over every order.",
        "",
        "| task | seed | target | together s | sequential s | any order s |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in timing["time_to_target"].items():
        for p in row["per_seed"]:
            lines.append(
                f"| {name} | {p['seed']} | {fmt(p['target'], 3)} | "
                f"{fmt(p['together_s'], 0)} | {fmt(p['sequential_s'], 0)} | "
                f"{fmt(p['sequential_any_order_s'], 0)} |"
            )
    lines += [
        "",
        "| task | together / sequential | together / any order |",
        "|---|---|---|",
    ]
    for name, row in timing["time_to_target"].items():
        lines.append(
            f"| {name} | {_ci(row['ratio_to_sequential'], 2)} "
            f"(n={row['ratio_to_sequential']['of_seeds']}) | "
            f"{_ci(row['ratio_to_sequential_any_order'], 2)} |"
        )
    done = timing["all_done"]
    per = ", ".join(
        f"{d['together_s']:.0f} / {d['sequential_s']:.0f}" for d in done["per_seed"]
    )
    a = result["audit"]
    lines += [
        "",
        f"All tenants done, together / sequential (s, per seed): {per}; ratio "
        f"{_ci(done['ratio'], 2)}.",
        "",
        f"Audit over {a['steps']} committed steps: mean logprob gap "
        f"{a['gap_mean']} (max {a['gap_max']}, limit {a['limit']}), "
        f"{a['over_limit']} over the limit, {len(a['served_other'])} served by "
        f"another adapter: {'holds' if a['holds'] else 'FAILS'}.",
        "",
        "![held-out reward against wall-clock time](learning_time.png)",
        "![held-out reward against steps](learning_steps.png)",
        "",
    ]
    return "\n".join(lines)


def format_probe(result: dict[str, Any]) -> str:
    lines = [
        "# The base model on each task's training prompts",
        "",
        *_provenance(result),
        f"{result['eval_prompts']} prompts x {result['eval_samples']} samples each; "
        "mixed = prompts whose samples disagree (GRPO groups with an advantage).",
        "",
        "| task | kind | accuracy | 95% CI (prompts) | mixed | seconds |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in result["tasks"].items():
        lines.append(
            f"| {name} | {r['task']['kind']} | {r['accuracy']:.3f} | "
            f"+-{r['ci95_prompts']:.3f} | {r['mixed_share']:.2f} | "
            f"{r['seconds']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def plot(result: dict[str, Any], out: Path) -> None:
    """Held-out reward per task against wall-clock time (together; sequential,
    each alone run shifted by the runs before it) and against steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from areal_marlaas.bench.learning_analysis import alone_label
    from areal_marlaas.bench.time_to_quality import sequential_starts

    names = list(result["per_task"])
    curves = result["curves"]
    for x_key, fname, xlabel in (
        ("t", "learning_time.png", "seconds since the start"),
        ("version", "learning_steps.png", "committed steps"),
    ):
        fig, axes = plt.subplots(
            1, len(names), figsize=(4.2 * len(names), 3.6), squeeze=False
        )
        for ax, name in zip(axes[0], names, strict=True):
            for seed in result["seeds"]:
                s = str(seed)
                durations = {
                    n: result["runs"][alone_label(seed, n)]["wall_s"] for n in names
                }
                shift = sequential_starts(durations, names)[name] if x_key == "t" else 0
                for cond, color, off in (
                    ("together", "tab:blue", 0.0),
                    ("alone", "tab:orange", shift),
                ):
                    pts = curves[cond][name][s]
                    label = None
                    if seed == result["seeds"][0]:
                        label = "together" if cond == "together" else "sequential"
                        if x_key == "version" and cond == "alone":
                            label = "alone"
                    ax.plot(
                        [p[x_key] + off for p in pts],
                        [p["reward"] for p in pts],
                        color=color,
                        alpha=0.7,
                        marker="o",
                        markersize=3,
                        label=label,
                    )
            for seed in result["seeds"]:
                bar = result["per_task"][name]["targets"][str(seed)]
                if bar is not None:
                    ax.axhline(bar, color="grey", linestyle=":", linewidth=0.8)
            ax.set_title(name)
            ax.set_xlabel(xlabel)
            ax.grid(alpha=0.3)
        axes[0][0].set_ylabel("held-out reward")
        axes[0][0].legend()
        fig.tight_layout()
        fig.savefig(out / fname, dpi=110)
        plt.close(fig)


def write(result: dict[str, Any], out: Path) -> None:
    """JSON keys are strings: write, then read back, so the report and the plot
    see exactly what the file holds."""
    out.mkdir(parents=True, exist_ok=True)
    text = json.dumps(result, indent=1)
    (out / "learning.json").write_text(text)
    saved = json.loads(text)
    (out / "learning.md").write_text(format_markdown(saved))
    try:
        plot(saved, out)
    except Exception as e:  # the numbers are written either way
        logger.error(f"plotting failed: {e}")
