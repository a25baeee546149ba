"""``marlaas simulate``: fit latency models to a bench run, check the simulator
against every measured configuration, then project to many tenants on a
modelled cluster. A bench folder is its bench.json plus either its raw run
folders or their fit input (``sim/fit_input.py``)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from areal_marlaas.scheduler.core import MODES, Mode
from areal_marlaas.sim.fit_input import load_fit_input, ok_runs, raw_run
from areal_marlaas.sim.latency import LatencyModels, RunLog, fit_models
from areal_marlaas.sim.simulator import SimTask, simulate


def load_bench(path: str | Path) -> tuple[dict[str, Any], Path]:
    path = Path(path)
    if path.is_dir():
        path = path / "bench.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no bench.json (run `marlaas bench` first)")
    return json.loads(path.read_text()), path.parent


def _ok_runs(
    result: dict[str, Any], root: Path
) -> list[tuple[dict, list, dict[str, int]]]:
    """Each successful run with its events and batch sizes: from its raw folder
    when there is one, else from the bench's fit input (what a committed result
    holds)."""
    out = []
    compact: dict[str, tuple[list, dict[str, int]]] | None = None
    for r in ok_runs(result):
        raw = raw_run(r, root)
        if raw is not None:
            if raw[0]:
                out.append((r, *raw))
            continue
        if compact is None:
            compact = load_fit_input(root)
        if r["label"] in compact:
            out.append((r, *compact[r["label"]]))
    return out


def profiles(result: dict[str, Any]) -> dict[str, str]:
    """Task name -> the task definition it runs: a bench of ``replicas`` of
    ``task`` names them ``<task>_<i>``, all one profile; otherwise each task is
    its own."""
    bench = result.get("bench") or {}
    base, n = bench.get("task"), bench.get("replicas") or 0
    if not base or n <= 0:
        return {}
    names = {t["name"] for r in result["runs"] for t in r.get("tasks") or []}
    prefix = f"{base}_"
    return {
        name: base
        for name in names
        if name.startswith(prefix) and name[len(prefix) :].isdigit()
    }


def sim_tasks(
    run: dict[str, Any], profile: dict[str, str] | None = None
) -> list[SimTask]:
    profile = profile or {}
    return [
        SimTask(
            t["name"],
            t["total_steps"],
            t["batch_size"] * t["n_samples"],
            t.get("max_new_tokens"),
            t.get("kv_bytes", 0),
            t.get("priority", 0),
            profile=profile.get(t["name"]),
        )
        for t in run["tasks"]
    ]


def run_log(
    run: dict[str, Any],
    events: list,
    seqs: dict[str, int],
    profile: dict[str, str] | None = None,
) -> RunLog:
    """``seqs``: per task, the sequences of one rollout batch (``task_seqs``)."""
    return RunLog(
        events,
        dict(seqs),
        {t["name"]: t.get("max_new_tokens") for t in run["tasks"]},
        dict(profile or {}),
    )


def fit_placements(
    result: dict[str, Any],
    root: Path,
    max_seqs: int | None = None,
    fit_modes: list[str] | None = None,
) -> dict[str, LatencyModels]:
    """One model set per placement, from its successful runs (of ``fit_modes``
    only, when given: the other modes' runs are then predicted out of sample)."""
    by_placement: dict[str, list[RunLog]] = {}
    profile = profiles(result)
    for r, events, seqs in _ok_runs(result, root):
        if fit_modes is not None and r["mode"] not in fit_modes:
            continue
        log = run_log(r, events, seqs, profile)
        by_placement.setdefault(r["placement"], []).append(log)
    models = {p: fit_models(logs, max_seqs) for p, logs in by_placement.items()}
    # Collocated runs are one task at a time: they cannot show batching gains,
    # so they borrow beta from the disaggregated fit when it has one.
    if "collocated" in models and "disaggregated" in models:
        co, dis = models["collocated"].rollout, models["disaggregated"].rollout
        if not co.beta_fitted and dis.beta_fitted:
            logs = by_placement["collocated"]
            models["collocated"] = fit_models(logs, max_seqs, default_beta=dis.beta)
            models["collocated"].fit["beta_from"] = "disaggregated"
    return models


def _max_rolling(run: dict[str, Any]) -> int | None:
    off = str(run.get("overrides", {}).get("scheduler.multi_lora", "")).lower()
    return 1 if off == "false" else None


def _elastic(run: dict[str, Any]) -> bool:
    """A run whose trainer borrowed cores: the train model does not cover it."""
    return bool(run.get("overrides", {}).get("scheduler.elastic_cpus"))


def validate(
    result: dict[str, Any],
    root: Path,
    models: dict[str, LatencyModels],
    fit_modes: list[str] | None = None,
    other_bench: str = "",
) -> list[dict[str, Any]]:
    """Simulate each measured run with its placement's models; a run of a mode
    the models were not fitted on, or of ``other_bench`` (a bench the models
    never saw), is out of sample."""
    rows = []
    profile = profiles(result)
    for r, _, _ in _ok_runs(result, root):
        m = models.get(r["placement"])
        if m is None or _elastic(r):
            continue
        tasks = sim_tasks(r, profile)
        sim = simulate(tasks, m, Mode(r["mode"]), max_rolling=_max_rolling(r))
        measured = r["metrics"]["wall_s"]
        sm = sim.metrics()
        rows.append(
            {
                "label": f"{other_bench}:{r['label']}" if other_bench else r["label"],
                "mode": r["mode"],
                "placement": r["placement"],
                "tenants": r["tenants"],
                "measured_wall_s": measured,
                "simulated_wall_s": sim.wall_s,
                "error_pct": 100 * (sim.wall_s - measured) / measured,
                "in_sample": not other_bench
                and (fit_modes is None or r["mode"] in fit_modes),
                "measured_steps_per_hour": r["metrics"]["train_steps_per_hour"],
                "simulated_steps_per_hour": sim.train_steps_per_hour,
                "measured_ttfs_p50_s": r["metrics"].get("ttfs_p50_s"),
                "simulated_ttfs_p50_s": sm.get("ttfs_p50_s"),
                "measured_tpts_p50_s": r["metrics"].get("tpts_p50_s"),
                "simulated_tpts_p50_s": sm.get("tpts_p50_s"),
            }
        )
    return rows


def template_tasks(result: dict[str, Any], mix: bool = False) -> list[dict[str, Any]]:
    """The tasks a projection replicates: the bench's first task, or with
    ``mix`` every task of its first run (the mix)."""
    runs = [r for r in result["runs"] if r.get("tasks")]
    if not runs:
        raise ValueError("bench.json has no run with tasks")
    return list(runs[0]["tasks"]) if mix else [runs[0]["tasks"][0]]


def project(
    result: dict[str, Any],
    models: dict[str, LatencyModels],
    tenants: list[int],
    rollout_devices: int = 1,
    train_devices: int = 1,
    kv_budget_per_device: int | None = None,
    steps: int | None = None,
    modes: tuple[str, ...] = MODES,
    mix: bool = False,
    env_s: list[float] | None = None,
) -> list[dict[str, Any]]:
    """Replicas of the bench's first task (``mix``: tenant ``i`` replicates the
    mix's task ``i mod len(mix)``) on the modelled cluster, each with its
    template's fitted latencies; ``env_s`` sweeps every task's tool-call time
    per batch (default: the fitted ones). ``collocated`` uses the collocated fit
    (rollout and training sharing the devices, one task at a time); the others
    the disaggregated fit."""
    templates = template_tasks(result, mix)
    profile = profiles(result)
    budget = kv_budget_per_device * rollout_devices if kv_budget_per_device else None
    rows = []
    for n in tenants:
        for env in env_s or [None]:
            tasks = [
                SimTask(
                    f"t{i}",
                    steps or t["total_steps"],
                    t["batch_size"] * t["n_samples"],
                    t.get("max_new_tokens"),
                    t.get("kv_bytes", 0),
                    env_s=env,
                    profile=profile.get(t["name"], t["name"]),  # the template's
                )
                for i, t in ((i, templates[i % len(templates)]) for i in range(n))
            ]
            group = []
            for mode in modes:
                placement = "collocated" if mode == "collocated" else "disaggregated"
                m = models.get(placement) or models.get("disaggregated")
                if m is None:
                    continue
                sim = simulate(
                    tasks,
                    m,
                    Mode(mode),
                    rollout_devices=rollout_devices,
                    trainers=train_devices,
                    kv_budget=budget,
                )
                met = sim.metrics()
                group.append(
                    {
                        "tenants": n,
                        "mode": mode,
                        "env_s": env,
                        "wall_s": sim.wall_s,
                        "train_steps_per_hour": sim.train_steps_per_hour,
                        "ttfs_p50_s": met.get("ttfs_p50_s"),
                        "ttfs_max_s": met.get("ttfs_max_s"),
                        "tpts_p50_s": met.get("tpts_p50_s"),
                        "train_busy": met.get("train_busy_events"),
                        "admission_holds": sim.holds,
                    }
                )
            seq = next((r["wall_s"] for r in group if r["mode"] == "sequential"), None)
            for r in group:
                r["vs_sequential"] = seq / r["wall_s"] if seq else None
            rows += group
    return rows


def _sample(r: dict[str, Any]) -> str:
    return "in" if r.get("in_sample", True) else "out"


def error_summary(rows: list[dict[str, Any]]) -> list[str]:
    """|error| mean and max, in and out of sample separately."""
    out = []
    for which in ("in", "out"):
        errs = [abs(r["error_pct"]) for r in rows if _sample(r) == which]
        if errs:
            out.append(
                f"|error| {which} of sample ({len(errs)} runs): mean "
                f"{statistics.fmean(errs):.1f}%, max {max(errs):.1f}%"
            )
    return out


def format_validation(rows: list[dict[str, Any]]) -> str:
    lines = [
        f"{'run':<24} {'mode':<11} {'tenants':>7} {'fit':>4} {'measured_s':>10} "
        f"{'simulated_s':>11} {'error':>7}"
    ]
    for r in rows:
        lines.append(
            f"{r['label']:<24} {r['mode']:<11} {r['tenants']:>7} {_sample(r):>4} "
            f"{r['measured_wall_s']:>10.1f} {r['simulated_wall_s']:>11.1f} "
            f"{r['error_pct']:>+6.1f}%"
        )
    return "\n".join(lines + error_summary(rows))


def _env(r: dict[str, Any]) -> str:
    return "fitted" if r.get("env_s") is None else f"{r['env_s']:g}"


def format_projection(rows: list[dict[str, Any]]) -> str:
    lines = [
        f"{'tenants':>7} {'mode':<11} {'env s':>6} {'wall_s':>10} {'steps/h':>10} "
        f"{'vs seq':>7} {'TTFS p50':>9} {'TPTS p50':>9} {'holds':>6}"
    ]

    def f(v, unit=""):
        return f"{v:.1f}{unit}" if v is not None else "-"

    for r in rows:
        lines.append(
            f"{r['tenants']:>7} {r['mode']:<11} {_env(r):>6} {r['wall_s']:>10.1f} "
            f"{r['train_steps_per_hour']:>10.1f} "
            f"{f(r.get('vs_sequential'), 'x'):>7} {f(r['ttfs_p50_s']):>9} "
            f"{f(r['tpts_p50_s']):>9} {r['admission_holds']:>6}"
        )
    return "\n".join(lines)


def format_models(models: dict[str, LatencyModels]) -> str:
    lines = []
    for p, m in models.items():
        r = m.rollout
        lines.append(
            f"{p}: rollout work {r.work_s:.3f}s/seq (at {r.ref_max_new_tokens} "
            f"new tokens), beta {r.beta:.2f}"
            + (
                ""
                if r.beta_fitted
                else f" (from the {m.fit['beta_from']} fit)"
                if m.fit.get("beta_from")
                else " (not identifiable: default)"
            )
            + f", x{1 + r.contention:.2f} beside training, overhead "
            f"{r.overhead_s:.2f}s, fit rmse {m.fit.get('rmse_s', 0):.2f}s; train "
            f"{m.train_intercept_s:.2f}s + {m.train_per_seq_s:.3f}s/seq alone, "
            f"x{1 + m.train_contention:.2f} while sequences generate; publish "
            f"{m.publish_s:.2f}s; env "
            + (", ".join(f"{t} {v:.2f}s" for t, v in m.env_by_task.items()) or "none")
            + " per batch"
        )
        if r.work_by_task or m.train_by_task:
            lines.append(
                "  per task (work s/seq, train s alone): "
                + ", ".join(
                    f"{t} "
                    + (f"{r.work_by_task[t]:.3f}" if t in r.work_by_task else "shared")
                    + " / "
                    + (f"{m.train_by_task[t]:.1f}" if t in m.train_by_task else "line")
                    for t in sorted(set(r.work_by_task) | set(m.train_by_task))
                )
            )
    return "\n".join(lines)


def simulate_bench(
    path: str | Path,
    tenants: list[int],
    rollout_devices: int = 1,
    train_devices: int = 1,
    kv_budget_per_device: int | None = None,
    steps: int | None = None,
    fit_modes: list[str] | None = None,
    predict: list[str | Path] | None = None,
    mix: bool = False,
    env_s: list[float] | None = None,
) -> dict[str, Any]:
    """Fit on the bench at ``path`` (its ``fit_modes`` runs), check against its
    runs and, out of sample, against the runs of the ``predict`` benches."""
    result, root = load_bench(path)
    max_seqs = result.get("max_num_seqs")
    models = fit_placements(result, root, max_seqs, fit_modes)
    if not models:
        modes = f" of modes {fit_modes}" if fit_modes else ""
        raise ValueError(f"{root}: no successful run{modes} to fit the models to")
    if kv_budget_per_device is None:
        kv_budget_per_device = result.get("kv_capacity_bytes")
    rows = validate(result, root, models, fit_modes)
    for other in predict or []:
        o_result, o_root = load_bench(other)
        rows += validate(o_result, o_root, models, other_bench=o_root.name)
    proj = project(
        result,
        models,
        tenants,
        rollout_devices,
        train_devices,
        kv_budget_per_device,
        steps,
        mix=mix,
        env_s=env_s,
    )
    return {
        "bench": str(root),
        "models": {p: m.to_dict() for p, m in models.items()},
        "fit_modes": fit_modes,
        "predicted_benches": [str(load_bench(o)[1]) for o in predict or []],
        "validation": rows,
        "replicates": [t["name"] for t in template_tasks(result, mix)],
        "cluster": {
            "rollout_devices": rollout_devices,
            "train_devices": train_devices,
            "kv_budget_per_device": kv_budget_per_device,
        },
        "projection": proj,
    }


def format_sim_markdown(out: dict[str, Any]) -> str:
    c = out["cluster"]
    lines = [
        "# marlaas simulate",
        "",
        "Latency models fitted to the bench's runs (per placement):",
        "",
        "```",
        format_models(
            {p: LatencyModels.from_dict(m) for p, m in out["models"].items()}
        ),
        "```",
        "",
        "## Measured vs simulated wall time",
        "",
        "Fitted on "
        + (f"the {out['fit_modes']} runs" if out.get("fit_modes") else "every run")
        + (
            f" of this bench; rows named `<bench>:<run>` are runs of "
            f"{out['predicted_benches']}, which the fit never saw"
            if out.get("predicted_benches")
            else ""
        )
        + "; `out` rows were predicted out of sample.",
        "",
        "| run | mode | tenants | fit | measured s | simulated s | error |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in out["validation"]:
        lines.append(
            f"| {r['label']} | {r['mode']} | {r['tenants']} | {_sample(r)} | "
            f"{r['measured_wall_s']:.1f} | {r['simulated_wall_s']:.1f} | "
            f"{r['error_pct']:+.1f}% |"
        )
    lines += ["", *error_summary(out["validation"])]
    kv = c["kv_budget_per_device"]
    lines += [
        "",
        f"## Projection: {c['rollout_devices']} rollout device(s), "
        f"{c['train_devices']} train device(s), KV budget "
        + (f"{kv / 2**30:.1f} GiB" if kv else "unlimited")
        + " per rollout device; tenants replicate "
        + ", ".join(f"`{t}`" for t in out.get("replicates", []))
        + " in turn, each with its template's fitted latencies",
        "",
        "| tenants | mode | env s per batch | wall s | steps/h | vs sequential "
        "| TTFS p50 s | TPTS p50 s | holds |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def f(v, unit=""):
        return "-" if v is None else f"{v:.1f}{unit}"

    for r in out["projection"]:
        lines.append(
            f"| {r['tenants']} | {r['mode']} | {_env(r)} | {r['wall_s']:.1f} | "
            f"{r['train_steps_per_hour']:.1f} | {f(r.get('vs_sequential'), 'x')} | "
            f"{f(r['ttfs_p50_s'])} | {f(r['tpts_p50_s'])} | {r['admission_holds']} |"
        )
    return "\n".join(lines) + "\n"
