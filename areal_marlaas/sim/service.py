"""The simulator against the job service (``marlaas simulate-service``): fit the
latency models on one service's ``marlaas bench-service`` runs, replay every
run's arrivals under its own service's policy (out of sample for the services
not fitted), and project the policies to many tenants.

What a bench-service run keeps for this (``fit_input.json`` beside
``bench_service.json``, written by the bench): the phase records the latency
fit reads, each task's sequences per batch, and per job its task, tenant,
arrival (seconds after the run's first) and steps. A job's set-up (validation,
hand-over to the trainer, adapter registration) is not simulated: the fit takes
the median time from arrival to first rollout of the fitted runs' jobs and
delays every simulated job by it.

Fairness at scale: the bench judges trainer fairness over the time every tenant
was backlogged, which with hundreds of tenants is empty. ``windowed_jain``
generalizes it: the run is cut into windows; in each, the tenants backlogged
for the whole window get their weighted trainer-seconds in it compared by
Jain's index; the result is the mean over windows with at least two such
tenants (with the all-backlogged window of a small run it agrees in spirit:
only tenants that wanted the trainer the whole time are compared).
"""

from __future__ import annotations

import json
import random
import statistics
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from areal_marlaas.bench.fairness import jain, overlap, tenant_intervals, union
from areal_marlaas.bench.run_metrics import percentile
from areal_marlaas.rundir.reader import phase_records
from areal_marlaas.scheduler.core import Concurrency, TrainOrder
from areal_marlaas.sim.fit_input import FIELDS, dumps, fit_events, task_seqs
from areal_marlaas.sim.latency import LatencyModels, RunLog, fit_models
from areal_marlaas.sim.simulator import SimTask, simulate

FORMAT = 1
WINDOW_STEPS = 4  # windowed_jain's window, in mean train steps


@dataclass(frozen=True)
class Policy:
    """What a bench-service service sets on the scheduling core."""

    train_order: TrainOrder
    concurrency: Concurrency = Concurrency.OFF


# The bench's services the simulator can replay (rollout_order=fair, the
# server's priorities, is not modelled: the simulated server shares its
# throughput equally between the sequences in flight).
POLICIES = {
    "async": Policy(TrainOrder.FIFO),
    "async_first": Policy(TrainOrder.FIRST_STEPS),
    "fair": Policy(TrainOrder.FAIR),
    "fair_adaptive": Policy(TrainOrder.FAIR, Concurrency.ADAPTIVE),
}


# -- what a bench-service run keeps ---------------------------------------------
def service_fit_run(
    events: list[dict[str, Any]],
    steps: list[dict[str, Any]],
    jobs: list[dict[str, Any]],
    offsets: list[float],
    first_arrival: float | None,
) -> dict[str, Any]:
    """One run's fit input: times in seconds after its first arrival."""
    t0 = first_arrival or 0.0
    rows = [
        [e[k] - t0 if k in ("start", "end") else e[k] for k in FIELDS]
        for e in fit_events(events)
    ]
    # The training queue's records too: the fairness of the measured run is
    # judged the way the simulated one is (windowed_jain).
    queue = [
        [e["task"], e["start"] - t0, e["end"] - t0]
        for e in phase_records(events)
        if e["phase"] == "queue"
    ]
    return {
        "seqs": task_seqs({}, steps),
        "events": rows,
        "queue": queue,
        "jobs": [
            {
                "task": j["task"],
                "tenant": j["tenant"],
                "arrival_s": at - offsets[0],
                "steps": len(j.get("commits") or []),
            }
            for j, at in zip(jobs, offsets, strict=True)
        ],
    }


def dump_service_fit(runs: Mapping[str, Any]) -> str:
    """``fit_input.json`` (``sim.fit_input.dumps``: one event per line)."""
    return dumps({"format": FORMAT, "fields": list(FIELDS), "runs": dict(runs)})


def load_service_fit(text: str) -> dict[str, dict[str, Any]]:
    """label -> {seqs, jobs, events (as dicts)} of a ``fit_input.json``."""
    data = json.loads(text)
    if data.get("format") != FORMAT or "jobs" not in next(
        iter(data["runs"].values()), {"jobs": []}
    ):
        raise ValueError(
            "not a bench-service fit_input.json (run marlaas bench-service again: "
            "it writes one beside bench_service.json)"
        )
    fields = data["fields"]
    return {
        label: {
            **run,
            "events": [dict(zip(fields, e, strict=True)) for e in run["events"]],
        }
        for label, run in data["runs"].items()
    }


# -- fit -------------------------------------------------------------------------
@dataclass
class ServiceModels:
    latency: LatencyModels
    setup_s: float  # arrival -> first rollout of a job the fit saw (median)


def first_rollouts(run: Mapping[str, Any]) -> dict[str, float]:
    """Each task's first rollout start (run seconds)."""
    first: dict[str, float] = {}
    for e in phase_records(run["events"]):
        if e["phase"] == "rollout":
            first[e["task"]] = min(first.get(e["task"], e["start"]), e["start"])
    return first


def fit_service_models(runs: Iterable[Mapping[str, Any]]) -> ServiceModels:
    """Latency models (each tenant's jobs one profile) and the set-up delay."""
    logs, setups = [], []
    for run in runs:
        profile = {j["task"]: j["tenant"] for j in run["jobs"]}
        logs.append(RunLog(run["events"], dict(run["seqs"]), {}, profile))
        first = first_rollouts(run)
        setups += [
            first[j["task"]] - j["arrival_s"] for j in run["jobs"] if j["task"] in first
        ]
    if not logs:
        raise ValueError("no runs to fit")
    return ServiceModels(fit_models(logs), statistics.median(setups) if setups else 0)


# -- replay and projection -------------------------------------------------------
def windowed_jain(
    events: Iterable[Mapping[str, Any]],
    tenant_of: Mapping[str, str],
    weights: Mapping[str, float],
    window_s: float,
) -> float | None:
    """Mean over windows of Jain's index of the weighted trainer-seconds of the
    tenants backlogged (a batch queued or training) for the whole window."""
    backlog, train = tenant_intervals(events, tenant_of)
    end = max((b for spans in backlog.values() for _, b in spans), default=0.0)
    covered = {t: union(spans) for t, spans in backlog.items()}
    values = []
    start = 0.0
    while start < end:
        w = (start, start + window_s)
        busy = [
            t
            for t, spans in covered.items()
            if any(a <= w[0] and w[1] <= b for a, b in spans)
        ]
        if len(busy) >= 2:
            served = [
                sum(overlap(s, [w]) for s in train.get(t, [])) / weights.get(t, 1.0)
                for t in busy
            ]
            x = jain(served)
            if x is not None:
                values.append(x)
        start += window_s
    return statistics.fmean(values) if values else None


def sim_metrics(
    tasks: list[SimTask],
    models: ServiceModels,
    policy: Policy,
    trainers: int = 1,
    rollout_devices: int = 1,
) -> dict[str, Any]:
    """Simulate ``tasks`` (arrival_s: when the job was created) under
    ``policy``: TTFS p50/p95 from creation, steps/h from the first arrival to
    the last commit, mean step, and the windowed Jain index."""
    delayed = [replace(t, arrival_s=t.arrival_s + models.setup_s) for t in tasks]
    r = simulate(
        delayed,
        models.latency,
        trainers=trainers,
        rollout_devices=rollout_devices,
        train_order=policy.train_order,
        concurrency=policy.concurrency,
        paired=trainers == rollout_devices,
    )
    # From creation: the simulated submission came the set-up later.
    ttfs = [x + models.setup_s for x in r.ttfs().values()]
    trains = [e["end"] - e["start"] for e in r.events if e["phase"] == "train"]
    step_s = statistics.fmean(trains) if trains else None
    last = max(s["t_commit"] for s in r.steps)
    t0 = min(t.arrival_s for t in tasks)
    tenant_of = {t.name: t.tenant for t in tasks}
    weights = {t.tenant: t.weight for t in tasks}
    p95 = percentile(ttfs, 95)
    window = WINDOW_STEPS * (step_s or 1.0)
    return {
        "ttfs_p50_s": percentile(ttfs, 50),
        "ttfs_p95_s": p95,
        "ttfs_p95_in_steps": p95 / step_s if p95 is not None and step_s else None,
        "steps_per_hour": len(r.steps) / (last - t0) * 3600 if last > t0 else None,
        "step_s": step_s,
        "jain": windowed_jain(r.events, tenant_of, weights, window),
    }


def run_tasks(run: Mapping[str, Any], weights: Mapping[str, float]) -> list[SimTask]:
    """A measured run's jobs as simulated tasks (each tenant's jobs one profile)."""
    return [
        SimTask(
            j["task"],
            max(1, j["steps"]),
            run["seqs"][j["task"]],
            profile=j["tenant"],
            tenant=j["tenant"],
            weight=weights.get(j["tenant"], 1.0),
            arrival_s=j["arrival_s"],
        )
        for j in run["jobs"]
        if j["task"] in run["seqs"]
    ]


def scaled_tasks(
    template: Mapping[str, Any],
    weights: Mapping[str, float],
    tenants: int,
    rate_per_min: float,
    seed: int,
) -> list[SimTask]:
    """``tenants`` tenants, each a copy of one template tenant in turn (its
    jobs' sizes, steps and weight); every job of the template run per tenant,
    arriving as one Poisson process at ``rate_per_min``."""
    base = run_tasks(template, weights)
    by: dict[str, list[SimTask]] = {}
    for t in base:
        by.setdefault(t.tenant, []).append(t)
    kinds = sorted(by)
    rng = random.Random(seed)
    jobs: list[SimTask] = []
    for i in range(tenants):
        kind = kinds[i % len(kinds)]
        for k, t in enumerate(by[kind]):
            jobs.append(
                SimTask(
                    f"u{i}-j{k}",
                    t.steps,
                    t.seqs,
                    profile=t.profile,
                    tenant=f"u{i}",
                    weight=t.weight,
                )
            )
    rng.shuffle(jobs)
    at = 0.0
    for job in jobs:
        job.arrival_s = at
        at += rng.expovariate(rate_per_min / 60)
    return jobs


def measured_jain(
    run: Mapping[str, Any], weights: Mapping[str, float], window_s: float
) -> float | None:
    """``windowed_jain`` of a measured run (its train and queue records)."""
    events = [e for e in run["events"] if e["phase"] == "train"]
    events += [
        {"phase": "queue", "task": t, "start": a, "end": b} for t, a, b in run["queue"]
    ]
    tenant_of = {j["task"]: j["tenant"] for j in run["jobs"]}
    return windowed_jain(events, tenant_of, weights, window_s)


VALIDATED = ("ttfs_p95_s", "steps_per_hour", "jain")


def simulate_service(
    result: Mapping[str, Any],
    fit_runs: Mapping[str, Mapping[str, Any]],
    fit_service: str = "async",
    scales: Iterable[int] = (100, 1000),
    seed: int = 0,
) -> dict[str, Any]:
    """Fit on ``fit_service``'s runs; replay every run under its own service's
    policy; project each policy to ``scales`` tenants (trainers and rollout
    servers scaled with the tenants, arrivals at the measured rate per
    trainer)."""
    ok = [
        r
        for r in result["runs"]
        if r.get("status") == "ok"
        and r["label"] in fit_runs
        and r["service"] in POLICIES
    ]
    fitted = [r for r in ok if r["service"] == fit_service]
    if not fitted:
        raise ValueError(
            f"no successful {fit_service!r} run with a fit input to fit on (the "
            f"services measured: {sorted({r['service'] for r in result['runs']})})"
        )
    models = fit_service_models([fit_runs[r["label"]] for r in fitted])
    weights = {
        t["name"]: float(t.get("weight", 1.0)) for t in result["load"]["tenants"]
    }
    rows = []
    for r in ok:
        run = fit_runs[r["label"]]
        sim = sim_metrics(run_tasks(run, weights), models, POLICIES[r["service"]])
        m = r["metrics"]
        window = WINDOW_STEPS * (m.get("step_s") or 1.0)
        measured = {
            "ttfs_p95_s": m.get("ttfs_p95_s"),
            "steps_per_hour": m.get("steps_per_hour"),
            "jain": measured_jain(run, weights, window),
        }
        rows.append(
            {
                "label": r["label"],
                "service": r["service"],
                "out_of_sample": r["service"] != fit_service,
                "measured": measured,
                "simulated": {k: sim[k] for k in VALIDATED},
            }
        )
    template = fit_runs[fitted[0]["label"]]
    kinds = len({j["tenant"] for j in template["jobs"]})
    rate = float(fitted[0]["rate_per_min"])
    projection = []
    for n in scales:
        machines = max(1, n // kinds)
        tasks = scaled_tasks(template, weights, n, rate * machines, seed)
        for service in ("async", "fair", "fair_adaptive"):
            t = time.perf_counter()
            met = sim_metrics(tasks, models, POLICIES[service], machines, machines)
            projection.append(
                {
                    "tenants": n,
                    "jobs": len(tasks),
                    "trainers": machines,
                    "service": service,
                    **met,
                    "sim_s": time.perf_counter() - t,
                }
            )
    return {
        "fit_service": fit_service,
        "setup_s": models.setup_s,
        "models": models.latency.to_dict(),
        "validation": rows,
        "errors": validation_errors(rows),
        "projection": projection,
    }


def validation_errors(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per metric, in and out of sample: the mean |simulated / measured - 1|."""
    out: dict[str, dict[str, Any]] = {}
    for metric in VALIDATED:
        for oos in (False, True):
            errs = [
                abs(r["simulated"][metric] / r["measured"][metric] - 1)
                for r in rows
                if r["out_of_sample"] is oos
                and r["simulated"][metric] is not None
                and r["measured"][metric]
            ]
            key = "out_of_sample" if oos else "in_sample"
            out.setdefault(metric, {})[key] = {
                "mean_abs_rel_error": statistics.fmean(errs) if errs else None,
                "runs": len(errs),
            }
    return out


def format_service_sim(out: Mapping[str, Any]) -> str:
    """The markdown report: validation per run, errors, projection."""

    def f(v: Any, nd: int = 1) -> str:
        return "-" if v is None else f"{v:.{nd}f}"

    lines = [
        f"Fitted on the `{out['fit_service']}` runs; every job delayed by the "
        f"fitted set-up {out['setup_s']:.1f} s.",
        "",
        "| run | out of sample | TTFS p95 s measured / sim | steps/h measured / sim "
        "| Jain (windowed) measured / sim |",
        "|---|---|---|---|---|",
    ]
    for r in out["validation"]:
        m, s = r["measured"], r["simulated"]
        lines.append(
            f"| {r['label']} | {'yes' if r['out_of_sample'] else 'no'} | "
            f"{f(m['ttfs_p95_s'])} / {f(s['ttfs_p95_s'])} | "
            f"{f(m['steps_per_hour'])} / {f(s['steps_per_hour'])} | "
            f"{f(m['jain'], 3)} / {f(s['jain'], 3)} |"
        )
    lines += ["", "| metric | in sample: mean abs rel error (runs) | out of sample |"]
    lines.append("|---|---|---|")
    for metric, e in out["errors"].items():
        a, b = e["in_sample"], e["out_of_sample"]
        pa = (
            "-" if a["mean_abs_rel_error"] is None else f"{a['mean_abs_rel_error']:.0%}"
        )
        pb = (
            "-" if b["mean_abs_rel_error"] is None else f"{b['mean_abs_rel_error']:.0%}"
        )
        lines.append(f"| {metric} | {pa} ({a['runs']}) | {pb} ({b['runs']}) |")
    lines += [
        "",
        "| tenants | jobs | trainers | service | TTFS p50 s | TTFS p95 s | "
        "TTFS p95 / step | steps/h per trainer | Jain (windowed) | sim s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in out["projection"]:
        per = (
            None if p["steps_per_hour"] is None else p["steps_per_hour"] / p["trainers"]
        )
        lines.append(
            f"| {p['tenants']} | {p['jobs']} | {p['trainers']} | {p['service']} | "
            f"{f(p['ttfs_p50_s'])} | {f(p['ttfs_p95_s'])} | "
            f"{f(p['ttfs_p95_in_steps'], 2)} | {f(per)} | {f(p['jain'], 3)} | "
            f"{f(p['sim_s'])} |"
        )
    return "\n".join(lines) + "\n"
