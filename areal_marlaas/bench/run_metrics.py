"""Metrics of one run directory (``events.jsonl``, ``steps.jsonl``, ``summary.json``)
plus the utilization samples the bench took while it ran.

Definitions (all times in seconds, absolute ``time.time()`` stamps in the logs):

* window: from the first phase record's start (every task is submitted when the
  run starts, and the first rollout starts at once) to the last one's end;
* wall: ``summary.json``'s ``wall_s`` when present, else the window's length;
* TTFS of a task: its first commit (``t_commit`` in ``steps.jsonl``) minus the
  window start; TPTS: the gaps between a task's consecutive commits (pooled over
  tasks);
* utilization from CPU time: CPU seconds a process tree used in the window over
  (window x cores it was given); idle %: the cores' unused share of the window;
* gauge busy: the share of samples in the window with ``num_requests_running > 0``.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from itertools import pairwise
from typing import Any

from areal_marlaas.rundir.reader import load_run, phase_records

__all__ = ["load_run", "ratios", "run_metrics", "utilization", "window"]


def percentile(xs: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default), ``q`` in [0, 100]."""
    if not xs:
        return None
    s = sorted(xs)
    pos = (len(s) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def window(events: list[dict[str, Any]]) -> tuple[float, float] | None:
    phases = phase_records(events)
    if not phases:
        return None
    return min(e["start"] for e in phases), max(e["end"] for e in phases)


def union_length(intervals: list[tuple[float, float]]) -> float:
    total, cur_s = 0.0, 0.0
    cur_e: float | None = None  # None until the first interval
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def _interp(samples: list[dict[str, float]], key: str, t: float) -> float:
    """A cumulative counter at time ``t`` (linear between samples, clamped)."""
    if t <= samples[0]["t"]:
        return samples[0][key]
    for a, b in pairwise(samples):
        if a["t"] <= t <= b["t"]:
            if b["t"] == a["t"]:
                return b[key]
            return a[key] + (b[key] - a[key]) * (t - a["t"]) / (b["t"] - a["t"])
    return samples[-1][key]


def utilization(
    samples: list[dict[str, float]],
    start: float,
    end: float,
    server_cores: float,
    trainer_cores: float,
    total_cores: float,
) -> dict[str, float | None]:
    """Busy fractions over ``[start, end]`` from samples ``{"t", "server_cpu",
    "trainer_cpu", "running"}`` (CPU in cumulative seconds of each process tree)."""
    out: dict[str, float | None] = {
        "rollout_util_cpu": None,
        "train_util_cpu": None,
        "idle_pct": None,
        "rollout_busy_gauge": None,
        "train_sys_share": None,
    }
    span = end - start
    samples = sorted(samples, key=lambda s: s["t"])
    if len(samples) < 2 or span <= 0:
        return out
    server = _interp(samples, "server_cpu", end) - _interp(samples, "server_cpu", start)
    trainer = _interp(samples, "trainer_cpu", end) - _interp(
        samples, "trainer_cpu", start
    )
    out["rollout_util_cpu"] = server / (span * server_cores)
    out["train_util_cpu"] = trainer / (span * trainer_cores)
    if all("trainer_sys" in x for x in samples):
        sys_s = _interp(samples, "trainer_sys", end) - _interp(
            samples, "trainer_sys", start
        )
        # Kernel time of the trainer: thread oversubscription shows up here.
        out["train_sys_share"] = sys_s / trainer if trainer > 0 else None
    out["idle_pct"] = 100 * max(0.0, 1 - (server + trainer) / (span * total_cores))
    inside = [s for s in samples if start <= s["t"] <= end and "running" in s]
    if inside:
        out["rollout_busy_gauge"] = sum(s["running"] > 0 for s in inside) / len(inside)
    return out


def run_metrics(
    run: dict[str, Any],
    samples: list[dict[str, float]] | None = None,
    cores: tuple[float, float, float] = (1, 1, 2),
) -> dict[str, Any]:
    """Everything the bench reports for one run (``run`` as from ``load_run``);
    ``cores`` = (server, trainer, total) cores of the run's placement."""
    events, steps, summary = run["events"], run["steps"], run["summary"]
    phases = phase_records(events)
    win = window(events)
    out: dict[str, Any] = {"steps": len(steps)}
    if win is None:
        return {**out, "wall_s": summary.get("wall_s"), "error": "no phase records"}
    t0, t1 = win
    wall = summary.get("wall_s") or (t1 - t0)
    commits: dict[str, list[float]] = defaultdict(list)
    for s in steps:
        commits[s["task"]].append(s["t_commit"])
    ttfs = {task: min(ts) - t0 for task, ts in commits.items()}
    gaps = []
    for ts in commits.values():
        ts = sorted(ts)
        gaps += [b - a for a, b in pairwise(ts)]
    by_phase: dict[str, list[float]] = defaultdict(list)
    for e in phases:
        by_phase[e["phase"]].append(e["end"] - e["start"])
    span = t1 - t0
    out.update(
        {
            "wall_s": wall,
            "window_s": span,
            "train_steps_per_hour": len(steps) / wall * 3600 if wall > 0 else 0.0,
            "ttfs_p50_s": statistics.median(ttfs.values()) if ttfs else None,
            "ttfs_max_s": max(ttfs.values()) if ttfs else None,
            "tpts_p50_s": percentile(gaps, 50),
            "tpts_p95_s": percentile(gaps, 95),
            "ttfs_s": ttfs,
            "phase_p50_s": {p: statistics.median(v) for p, v in by_phase.items()},
            "phase_total_s": {p: sum(v) for p, v in by_phase.items()},
            # From the logs alone: the share of the window with some rollout in
            # flight / the trainer busy (upper bounds of device busy time).
            "rollout_busy_events": union_length(
                [(e["start"], e["end"]) for e in phases if e["phase"] == "rollout"]
            )
            / span
            if span > 0
            else None,
            "train_busy_events": union_length(
                [(e["start"], e["end"]) for e in phases if e["phase"] == "train"]
            )
            / span
            if span > 0
            else None,
        }
    )
    last_commit = max((s["t_commit"] for s in steps), default=t0)
    if last_commit > t0:
        # Training alone: a run's final evals end after its last commit.
        out["commit_steps_per_hour"] = len(steps) / (last_commit - t0) * 3600
    out.update(eval_overlap(phases))
    out.update(trainer_bound(phases, steps, t0, span))
    out.update(utilization(samples or [], t0, t1, *cores))
    out.update(memory_peaks(samples or []))
    failed = {
        n: t.get("error") or t.get("status")
        for n, t in summary.get("tasks", {}).items()
        if t.get("status") not in (None, "done")
    }
    if failed:
        out["failed_tasks"] = failed
    return out


def eval_overlap(phases: list[dict[str, Any]]) -> dict[str, Any]:
    """Evals, and the share of those (not a task's last) whose task's next
    rollout, of the version evaluated, started before the eval ended."""
    evals = [e for e in phases if e["phase"] == "eval"]
    if not evals:
        return {}
    rollouts = {(e["task"], e["version"]): e for e in phases if e["phase"] == "rollout"}
    followed = [e for e in evals if (e["task"], e["version"]) in rollouts]
    beside = [
        e for e in followed if rollouts[(e["task"], e["version"])]["start"] < e["end"]
    ]
    return {
        "evals": len(evals),
        "eval_p50_s": statistics.median(e["end"] - e["start"] for e in evals),
        "evals_beside_next_rollout": len(beside) / len(followed) if followed else None,
    }


def memory_peaks(samples: list[dict[str, float]]) -> dict[str, float]:
    """Peak memory over a run's samples, GiB: ``peak_mem_gib`` of the run's own
    processes (server + trainer trees, PSS) and ``peak_machine_gib``, the whole
    machine's used memory (an independent check: it also holds everything
    else that runs)."""
    out = {}
    own = [s["server_mem"] + s["trainer_mem"] for s in samples if "server_mem" in s]
    if own:
        out["peak_mem_gib"] = max(own) / 2**30
    machine = [s["machine_mem"] for s in samples if "machine_mem" in s]
    if machine:
        out["peak_machine_gib"] = max(machine) / 2**30
    return out


def trainer_bound(
    phases: list[dict[str, Any]], steps: list[dict[str, Any]], t0: float, span: float
) -> dict[str, float]:
    """The trainers' bound: no run can end before its first rollout is back
    plus every train phase of the busiest trainer done one after another (at
    the speed they ran; with one trainer, all of them); efficiency = bound /
    window. A task's steps run on one trainer (``trainer`` in its step records,
    0 when absent). Plus the trainer's mean cores (elastic steps record theirs;
    weighted by train time)."""
    rollouts = [e["end"] for e in phases if e["phase"] == "rollout"]
    trainer_of = {s["task"]: s.get("trainer") or 0 for s in steps}
    per_trainer: dict[int, float] = {}
    for e in phases:
        if e["phase"] == "train":
            k = trainer_of.get(e["task"], 0)
            per_trainer[k] = per_trainer.get(k, 0.0) + e["end"] - e["start"]
    train = max(per_trainer.values(), default=0.0)
    out: dict[str, float] = {}
    if rollouts and span > 0:
        bound = min(rollouts) - t0 + train
        out["trainer_bound_s"] = bound
        out["bound_efficiency"] = bound / span
    timed = [s for s in steps if s.get("cores_mean") is not None and s.get("train_s")]
    if timed:
        total = sum(s["train_s"] for s in timed)
        out["train_cores_mean"] = (
            sum(s["cores_mean"] * s["train_s"] for s in timed) / total
        )
        out["borrowed_share"] = sum(s.get("borrowed_s", 0.0) for s in timed) / total
    return out


def ratios(
    metrics: dict[str, dict[str, Any]], baseline: str = "sequential"
) -> dict[str, dict[str, float | None]]:
    """Per run: speedup (baseline wall / wall) and throughput ratio (steps/h over
    the baseline's)."""
    base = metrics.get(baseline) or {}
    b_wall, b_tput = base.get("wall_s"), base.get("train_steps_per_hour")
    out = {}
    for label, m in metrics.items():
        wall, tput = m.get("wall_s"), m.get("train_steps_per_hour")
        out[label] = {
            "speedup_vs_" + baseline: b_wall / wall if b_wall and wall else None,
            "throughput_vs_" + baseline: tput / b_tput if b_tput and tput else None,
        }
    return out
