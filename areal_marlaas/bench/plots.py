"""PNG plots of a bench result: per-task phase timelines per mode, utilization
over time, and throughput / utilization / TTFS / TPTS against tenant count."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path
from typing import Any

from areal_marlaas.rundir.reader import read_jsonl

COLORS = {
    "wait": "gold",  # held by admission, a sync barrier or its turn
    "rollout": "tab:blue",
    "env": "tab:purple",
    "queue": "tab:gray",
    "train": "tab:red",
    "publish": "tab:green",
}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_timelines(
    runs: dict[str, list[dict[str, Any]]], path: Path, title: str = ""
) -> None:
    """``runs``: label -> phase records (times relative to the run's start); one
    panel per run, one row per task, one bar per phase interval."""
    plt = _plt()
    from matplotlib.patches import Patch

    n = max(1, len(runs))
    rows = max((len({e["task"] for e in ev}) for ev in runs.values()), default=1)
    fig, axes = plt.subplots(
        1, n, figsize=(4.2 * n, 1.0 + 0.35 * rows), sharey=False, squeeze=False
    )
    tmax = max(
        (e["end"] for ev in runs.values() for e in ev if "phase" in e), default=1.0
    )
    for ax, (label, events) in zip(axes[0], runs.items(), strict=False):
        phases = [e for e in events if "phase" in e]
        tasks = sorted({e["task"] for e in phases}, key=_natural)
        for i, task in enumerate(tasks):
            for e in phases:
                if e["task"] != task:
                    continue
                ax.broken_barh(
                    [(e["start"], max(e["end"] - e["start"], 1e-3))],
                    (i - 0.4, 0.8),
                    color=COLORS.get(e["phase"], "black"),
                    linewidth=0,
                )
        ax.set_yticks(range(len(tasks)))
        ax.set_yticklabels(tasks, fontsize=7)
        ax.set_xlim(0, tmax * 1.02)
        ax.set_xlabel("s since run start")
        ax.set_title(label, fontsize=9)
        ax.invert_yaxis()
    handles = [Patch(color=c, label=p) for p, c in COLORS.items()]
    fig.legend(handles=handles, loc="upper right", ncol=len(COLORS), fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10, x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_utilization(
    samples: dict[str, list[dict[str, Any]]],
    cores: dict[str, dict[str, float]],
    path: Path,
) -> None:
    """Per run: server and trainer CPU busy (per given core, from CPU-time
    deltas between samples) and the running-request gauge."""
    plt = _plt()
    n = max(1, len(samples))
    fig, axes = plt.subplots(1, n, figsize=(4.2 * n, 3.0), squeeze=False)
    for ax, (label, ss) in zip(axes[0], samples.items(), strict=False):
        c = cores.get(label, {"server": 1, "trainer": 1})
        ts, su, tu, run = [], [], [], []
        for a, b in pairwise(ss):
            dt = b["t"] - a["t"]
            if dt <= 0:
                continue
            ts.append(b["t"])
            su.append(max(0.0, (b["server_cpu"] - a["server_cpu"]) / dt / c["server"]))
            tu.append(
                max(0.0, (b["trainer_cpu"] - a["trainer_cpu"]) / dt / c["trainer"])
            )
            run.append(b.get("running", 0))
        ax.plot(ts, su, color="tab:blue", lw=0.8, label="server CPU")
        ax.plot(ts, tu, color="tab:red", lw=0.8, label="trainer CPU")
        ax.set_ylim(0, 1.3)
        ax.set_xlabel("s since run start")
        ax.set_ylabel("busy (per core given)")
        ax.set_title(label, fontsize=9)
        ax2 = ax.twinx()
        ax2.fill_between(ts, run, step="post", color="tab:green", alpha=0.2)
        ax2.set_ylabel("requests running", fontsize=7, color="tab:green")
        ax2.tick_params(labelsize=7)
        if ax is axes[0][0]:
            ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_concurrency(points: list[tuple[int, dict[str, Any]]], path: Path) -> None:
    """``points``: (tenants, metrics) of the sweep runs."""
    plt = _plt()
    points = sorted(points)
    xs = [k for k, _ in points]

    def col(key):
        nan = float("nan")
        return [nan if m.get(key) is None else m[key] for _, m in points]

    fig, axes = plt.subplots(1, 4, figsize=(15, 3.2))
    axes[0].plot(xs, col("train_steps_per_hour"), "o-")
    axes[0].set_ylabel("train steps / hour")
    axes[1].plot(xs, col("rollout_util_cpu"), "o-", label="rollout (CPU)")
    axes[1].plot(xs, col("rollout_busy_gauge"), "s--", label="rollout (gauge)")
    axes[1].plot(xs, col("train_util_cpu"), "^-", label="train (CPU)")
    axes[1].set_ylabel("utilization")
    axes[1].set_ylim(0, 1.1)
    axes[1].legend(fontsize=7)
    axes[2].plot(xs, col("ttfs_p50_s"), "o-", label="p50")
    axes[2].plot(xs, col("ttfs_max_s"), "s--", label="max")
    axes[2].set_ylabel("TTFS s")
    axes[2].legend(fontsize=7)
    axes[3].plot(xs, col("tpts_p50_s"), "o-", label="p50")
    axes[3].plot(xs, col("tpts_p95_s"), "s--", label="p95")
    axes[3].set_ylabel("TPTS s")
    axes[3].legend(fontsize=7)
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs)
        ax.set_xticklabels([str(x) for x in xs])
        ax.set_xlabel("tenants")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _natural(name: str):
    head, _, tail = name.rpartition("_")
    return (head, int(tail)) if tail.isdigit() else (name, -1)


def plot_all(result: dict[str, Any], out: Path) -> list[Path]:
    runs = {r["label"]: r for r in result["runs"] if r.get("metrics")}
    # One timeline per configuration: its first repeat.
    main = [
        lbl
        for lbl, r in runs.items()
        if r["group"] in ("mode", "ablation") and r.get("repeat", 0) == 0
    ]
    written = []
    timelines = {lbl: read_jsonl(out / "runs" / lbl / "events.jsonl") for lbl in main}
    if timelines:
        plot_timelines(timelines, out / "timeline.png", "per-task phases per mode")
        written.append(out / "timeline.png")
        samples = {
            lbl: read_jsonl(out / "runs" / lbl / "samples.jsonl") for lbl in main
        }
        cores = {lbl: runs[lbl]["cores"] for lbl in main}
        plot_utilization(samples, cores, out / "utilization.png")
        written.append(out / "utilization.png")
    first = {r.get("config", r["label"]): r for r in reversed(list(runs.values()))}
    points = [
        (int(k), first[cfg]["metrics"])
        for k, cfg in result.get("sweep", {}).items()
        if cfg in first
    ]
    if points:
        plot_concurrency(points, out / "concurrency.png")
        written.append(out / "concurrency.png")
    return written
