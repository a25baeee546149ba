"""What ``marlaas bench`` writes: bench.json, bench.md (tables), plots, the
simulator's fit input, and each run's logs with times relative to its start
(under ``runs/``: raw, not for committing)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from areal.utils import logging

from areal_marlaas.fmt import fmt
from areal_marlaas.sim.fit_input import write_fit_input

logger = logging.getLogger("MARLaaSBench")

OUT_LIMIT_BYTES = 3 * 2**20


def _compact_event(e: dict[str, Any], t0: float) -> dict[str, Any]:
    out = dict(e)
    for k in ("start", "end", "t"):
        if isinstance(out.get(k), int | float):
            out[k] = round(out[k] - t0, 3)
    return out


_STEP_KEYS = (
    "task",
    "version",
    "reward_mean",
    "staleness_max",
    "n_trajectories",
    "queue_wait_s",
    "train_s",
    "t_commit",
)


def compact_run(
    run: dict[str, Any], samples: list[dict[str, Any]], dest: Path, max_samples: int
) -> float:
    """Write the run's logs to ``dest`` with times relative to the run's first
    phase record (rounded to ms) and samples thinned to ``max_samples``; returns
    the time origin."""
    dest.mkdir(parents=True, exist_ok=True)
    starts = [e["start"] for e in run["events"] if "phase" in e]
    t0 = min(starts) if starts else 0.0
    with open(dest / "events.jsonl", "w") as f:
        for e in run["events"]:
            f.write(json.dumps(_compact_event(e, t0)) + "\n")
    with open(dest / "steps.jsonl", "w") as f:
        for s in run["steps"]:
            rec = {k: s.get(k) for k in _STEP_KEYS}
            if s.get("trainer"):  # several trainer workers
                rec["trainer"] = s["trainer"]
            for k in ("cores_mean", "borrowed_s"):  # pinned in-process trainers
                if isinstance(s.get(k), float):
                    rec[k] = round(s[k], 3)
            rec["t_commit"] = round(s["t_commit"] - t0, 3)
            for k in ("reward_mean", "queue_wait_s", "train_s"):
                if isinstance(rec[k], float):
                    rec[k] = round(rec[k], 4)
            f.write(json.dumps(rec) + "\n")
    summary = {k: v for k, v in run["summary"].items() if k != "run_dir"}
    (dest / "summary.json").write_text(json.dumps(summary, indent=1))
    stride = max(1, -(-len(samples) // max_samples))
    with open(dest / "samples.jsonl", "w") as f:
        for s in samples[::stride]:
            rec = {k: round(v, 3) for k, v in s.items()}
            rec["t"] = round(s["t"] - t0, 3)
            f.write(json.dumps(rec) + "\n")
    return t0


def _pair(m: dict[str, Any], a: str, b: str) -> str:
    return f"{fmt(m.get(a))}/{fmt(m.get(b))}"


def format_result(r: dict[str, Any]) -> str:
    m = r.get("metrics") or {}
    if r["status"] != "ok":
        return f"{r['label']}: {r['status'].upper()} {r.get('error', '')}"
    return (
        f"{r['label']}: wall {fmt(m.get('wall_s'))}s, "
        f"{fmt(m.get('train_steps_per_hour'))} steps/h, "
        f"rollout util {fmt(m.get('rollout_util_cpu'), pct=True)}, "
        f"train util {fmt(m.get('train_util_cpu'), pct=True)}, "
        f"TTFS p50 {fmt(m.get('ttfs_p50_s'))}s, TPTS p50 {fmt(m.get('tpts_p50_s'))}s"
    )


MD_COLUMNS = [
    ("run", lambda r, m: r["label"]),
    ("mode", lambda r, m: r["mode"]),
    ("placement", lambda r, m: r["placement"]),
    ("tenants", lambda r, m: str(r["tenants"])),
    ("status", lambda r, m: r["status"]),
    ("wall s", lambda r, m: fmt(m.get("wall_s"))),
    ("steps/h", lambda r, m: fmt(m.get("train_steps_per_hour"))),
    (
        "speedup vs seq",
        lambda r, m: fmt(r.get("ratios", {}).get("speedup_vs_sequential"), 2),
    ),
    ("rollout util (CPU)", lambda r, m: fmt(m.get("rollout_util_cpu"), pct=True)),
    ("rollout busy (gauge)", lambda r, m: fmt(m.get("rollout_busy_gauge"), pct=True)),
    ("train util (CPU)", lambda r, m: fmt(m.get("train_util_cpu"), pct=True)),
    ("idle %", lambda r, m: fmt(m.get("idle_pct"), 0)),
    ("TTFS p50/max s", lambda r, m: _pair(m, "ttfs_p50_s", "ttfs_max_s")),
    ("TPTS p50/p95 s", lambda r, m: _pair(m, "tpts_p50_s", "tpts_p95_s")),
]


# Metrics aggregated over repeats: (header, metric key or ratio key, digits, pct).
AGG_COLUMNS = (
    ("wall s", "wall_s", 1, False),
    ("steps/h", "train_steps_per_hour", 1, False),
    ("steps/h to last commit", "commit_steps_per_hour", 1, False),
    ("evals beside next rollout", "evals_beside_next_rollout", 2, True),
    ("speedup vs seq", "ratio:speedup_vs_sequential", 2, False),
    ("rollout util (CPU)", "rollout_util_cpu", 2, True),
    ("train util (CPU)", "train_util_cpu", 2, True),
    ("trainer sys share", "train_sys_share", 2, True),
    ("trainer cores", "train_cores_mean", 2, False),
    ("vs trainer bound", "bound_efficiency", 2, True),
    ("TTFS p50 s", "ttfs_p50_s", 1, False),
    ("TPTS p50 s", "tpts_p50_s", 1, False),
    ("end-to-end s", "e2e_s", 1, False),
    ("steps/h end to end", "e2e_steps_per_hour", 1, False),
    ("peak mem GiB", "peak_mem_gib", 2, False),
)


def _value(r: dict[str, Any], key: str) -> float | None:
    if key.startswith("ratio:"):
        return r.get("ratios", {}).get(key[len("ratio:") :])
    return (r.get("metrics") or {}).get(key)


def mean_sd(xs: Sequence[float | None]) -> tuple[float | None, float | None]:
    import statistics

    known = [x for x in xs if x is not None]
    if not known:
        return None, None
    return statistics.fmean(known), statistics.stdev(known) if len(known) > 1 else None


def _ms(xs: Sequence[float | None], digits: int, pct: bool) -> str:
    mean, sd = mean_sd(xs)
    if mean is None:
        return "-"
    scale, unit = (100, "%") if pct else (1, "")
    text = f"{mean * scale:.{0 if pct else digits}f}{unit}"
    if sd is not None:
        text += f" +- {sd * scale:.{0 if pct else digits}f}"
    return text


def aggregate(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per configuration: its successful repeats' metrics, mean +- sd."""
    configs: dict[str, list[dict[str, Any]]] = {}
    for r in result["runs"]:
        configs.setdefault(r.get("config", r["label"]), []).append(r)
    rows = []
    for config, runs in configs.items():
        ok = [r for r in runs if r["status"] == "ok"]
        first = runs[0]
        row = {
            "config": config,
            "mode": first["mode"],
            "scheduler": first.get("scheduler", "null"),
            "trainers": int(first.get("overrides", {}).get("scheduler.trainers", 1)),
            "placement": first["placement"],
            "tenants": first["tenants"],
            "ok": len(ok),
            "n": len(runs),
        }
        for header, key, digits, pct in AGG_COLUMNS:
            row[header] = _ms([_value(r, key) for r in ok], digits, pct)
            row[key] = mean_sd([_value(r, key) for r in ok])
        rows.append(row)
    return rows


def train_times(result: dict[str, Any]) -> list[str]:
    """Per configuration: the mean train phase of each task's first step and of
    its later ones (a first-step warm-up shows as a gap)."""
    lines = [
        "",
        "Train phase per step (s, mean over tasks and repeats): each task's first "
        "step vs its later steps.",
        "",
        "| run | first step | later steps |",
        "|---|---|---|",
    ]
    configs: dict[str, tuple[list[float], list[float]]] = {}
    for r in result["runs"]:
        by_task = r.get("train_s_by_task") or {}
        first, later = configs.setdefault(r.get("config", r["label"]), ([], []))
        for times in by_task.values():
            if times:
                first.append(times[0])
                later.extend(times[1:])
    if not any(f for f, _ in configs.values()):
        return []
    for config, (first, later) in configs.items():
        lines.append(f"| {config} | {_ms(first, 1, False)} | {_ms(later, 1, False)} |")
    return lines


def replicated_table(result: dict[str, Any]) -> list[str]:
    """MARLaaS (the sweep's async run at N tenants) against N replicated AReaL
    jobs: end to end (each system's start-up included), steps/h, peak memory."""
    rows = {r["config"]: r for r in aggregate(result)}
    counts = sorted(
        {r["tenants"] for r in result["runs"] if r.get("placement") == "replicated"}
    )
    if not counts:
        return []
    lines = [
        "",
        "MARLaaS vs replicated AReaL (N PPOTrainer jobs, each with its own vLLM "
        "server, started together, unpinned). End to end = what a user starting "
        "fresh waits: MARLaaS's server start-up + its run; each AReaL job's own "
        "start-up is inside its wall. Memory: peak PSS of the run's process trees.",
        "",
        "| tenants | MARLaaS steps/h | AReaL steps/h | speedup | MARLaaS peak GiB | "
        "AReaL peak GiB | AReaL status |",
        "|---|---|---|---|---|---|---|",
    ]
    sweep = result.get("sweep") or {}
    for n in counts:
        areal = rows.get(f"areal_x{n}")
        mine = rows.get(sweep.get(str(n), ""))
        statuses = sorted(
            {r["status"] for r in result["runs"] if r.get("config") == f"areal_x{n}"}
        )

        def cell(row, key):
            return row[key] if row else "-"

        a = (areal or {}).get("e2e_steps_per_hour", (None, None))[0]
        m = (mine or {}).get("e2e_steps_per_hour", (None, None))[0]
        lines.append(
            f"| {n} | {cell(mine, 'steps/h end to end')} | "
            f"{cell(areal, 'steps/h end to end')} | "
            f"{fmt(m / a, 2) + 'x' if a and m else '-'} | "
            f"{cell(mine, 'peak mem GiB')} | {cell(areal, 'peak mem GiB')} | "
            f"{', '.join(statuses)} |"
        )
    return lines


def format_markdown(result: dict[str, Any]) -> str:
    b = result["bench"]
    lines = [
        "# marlaas bench",
        "",
        f"Model `{Path(result['model']).name}`; workload: "
        + (
            f"{b['replicas']} replicas of `{b['task']}`"
            if b["task"]
            else "the task mix"
        )
        + f", {b['steps'] or 'own'} steps each. Disaggregated: server on cores "
        f"{b['server_cpus']}, trainer on {b['trainer_cpus']}; collocated: both on "
        f"{b['collocated_cpus']}. Utilization = CPU time of the process tree / (window"
        " x its cores); gauge = share of samples with `num_requests_running > 0`.",
        "",
    ]
    if result.get("machine"):
        from areal_marlaas.bench.machine import describe

        lines += [f"Machine: {describe(result['machine'])}.", ""]
    headers = [h for h, *_ in AGG_COLUMNS]
    lines += [
        f"Mean +- sd over {b.get('repeats', 1)} interleaved repeat(s) per "
        "configuration (`@local`: the trainer as AReaL LocalScheduler workers, the "
        "default path; otherwise in the run's process).",
        "",
        "| run | mode | trainer | tenants | ok | " + " | ".join(headers) + " |",
        "|" + "---|" * (5 + len(headers)),
    ]
    for row in aggregate(result):
        cells = [
            row["config"],
            row["mode"],
            ("LocalScheduler" if row["scheduler"] == "local" else "in-process")
            + (f" x{row['trainers']}" if row["trainers"] > 1 else ""),
            str(row["tenants"]),
            f"{row['ok']}/{row['n']}",
            *(row[h] for h in headers),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += train_times(result)
    lines += replicated_table(result)
    lines += [
        "",
        "Every run:",
        "",
        "| " + " | ".join(c for c, _ in MD_COLUMNS) + " |",
        "|" + "---|" * len(MD_COLUMNS),
    ]
    for r in result["runs"]:
        m = r.get("metrics") or {}
        lines.append("| " + " | ".join(fn(r, m) for _, fn in MD_COLUMNS) + " |")
    failed = [r for r in result["runs"] if r["status"] != "ok"]
    if failed:
        lines += ["", "Failed runs:", ""]
        for r in failed:
            why = r.get("error") or (r.get("log_tail") or "").splitlines()[-1:] or [""]
            lines.append(f"* `{r['label']}`: {why if isinstance(why, str) else why[0]}")
    lines += format_phase_table(result["runs"])
    lines += [
        "",
        "![phase timeline](timeline.png)",
        "",
        "![utilization](utilization.png)",
        "",
    ]
    if result.get("sweep"):
        lines += ["![concurrency sweep](concurrency.png)", ""]
    return "\n".join(lines)


# Per-task phase columns: (header, phase, statistic). ``wait`` is time ready to
# roll out but held (sync barrier, admission, turn): summed, since it happens on
# some steps only; the others are per-step means.
PHASE_COLUMNS = (
    ("rollout mean s", "rollout", "mean"),
    ("wait total s", "wait", "total"),
    ("queue mean s", "queue", "mean"),
    ("train mean s", "train", "mean"),
    ("publish mean s", "publish", "mean"),
)


def format_phase_table(runs: list[dict[str, Any]]) -> list[str]:
    """Markdown lines: each run's per-task rollout latency and waiting time (the
    paper's Table 1 view), from the phases recorded in its ``events.jsonl``."""
    rows = [r for r in runs if r.get("phases")]
    if not rows:
        return []
    lines = [
        "",
        "Per task (wait = held by a sync barrier, admission or its turn; queue = "
        "waiting for the trainer):",
        "",
        "| run | task | steps | " + " | ".join(h for h, _, _ in PHASE_COLUMNS) + " |",
        "|" + "---|" * (3 + len(PHASE_COLUMNS)),
    ]
    for r in rows:
        for task in sorted(t for t in r["phases"] if t != "all"):
            ph = r["phases"][task]
            cells = [r["label"], task, str(ph.get("train", {}).get("n", 0))]
            for _, phase, stat in PHASE_COLUMNS:
                s = ph.get(phase)
                if s is None:
                    cells.append("0.0" if stat == "total" else "-")
                else:
                    v = s["mean_s"] * s["n"] if stat == "total" else s["mean_s"]
                    cells.append(f"{v:.1f}")
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def write_outputs(result: dict[str, Any], out: Path) -> None:
    from areal_marlaas.bench.plots import plot_all

    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(result, indent=1))
    (out / "bench.md").write_text(format_markdown(result))
    # What `marlaas simulate` fits from once the raw runs/ are left behind.
    write_fit_input(result, out)
    try:
        plot_all(result, out)
    except Exception as e:  # plots are a convenience; the numbers are written
        logger.error(f"plotting failed: {type(e).__name__}: {e}")
    # Only what gets committed counts: a result goes in without its raw runs/.
    size = sum(
        p.stat().st_size
        for p in out.rglob("*")
        if p.is_file() and "runs" not in p.relative_to(out).parts[:1]
    )
    if size > OUT_LIMIT_BYTES:
        logger.warning(
            f"{out} holds {size / 2**20:.1f} MiB (> 3 MiB) besides runs/: "
            "do not commit it as is"
        )
    print(f"[bench] wrote {out} ({size / 1024:.0f} KiB)", flush=True)
