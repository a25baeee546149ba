"""``marlaas simulate-service``: the windowed fairness index, the fit input a
bench-service run keeps, and fit -> replay -> projection on runs whose true
latencies are known (made by the simulator itself from known models)."""

from __future__ import annotations

import json

import pytest

from areal_marlaas.cli import main as marlaas
from areal_marlaas.sim.latency import LatencyModels, RolloutModel
from areal_marlaas.sim.service import (
    POLICIES,
    dump_service_fit,
    fit_service_models,
    load_service_fit,
    simulate_service,
    windowed_jain,
)
from areal_marlaas.sim.simulator import SimTask, simulate


def ev(phase: str, task: str, start: float, end: float) -> dict:
    return {"phase": phase, "task": task, "start": start, "end": end, "version": 0}


def test_windowed_jain_compares_only_tenants_backlogged_the_whole_window():
    events = [
        ev("queue", "a", 0, 20),
        ev("train", "a", 0, 15),
        ev("queue", "b", 0, 20),
        ev("train", "b", 15, 20),
        ev("queue", "c", 12, 20),  # part of the second window only: left out
        ev("train", "c", 12, 13),
    ]
    tenants = {"a": "A", "b": "B", "c": "C"}
    # Window 1: A 10 s, B 0 s -> 0.5; window 2: A 5 s, B 5 s -> 1.0.
    assert windowed_jain(events, tenants, {}, 10.0) == pytest.approx(0.75)
    # B's weight 0.5 doubles its weighted seconds: window 2 is 5 vs 10.
    assert windowed_jain(events, tenants, {"B": 0.5}, 10.0) == pytest.approx(
        (0.5 + 0.9) / 2
    )


TRUE = LatencyModels(
    rollout=RolloutModel(work_s=4.0, beta=1.0),
    train_intercept_s=2.0,
    train_per_seq_s=0.25,
)


def measured_run(seed: int, service: str) -> tuple[dict, dict]:
    """A bench-service run as the bench records it, made by the simulator from
    TRUE: a heavy tenant (32 seqs a batch) and two light ones (4), 2 jobs each
    of 4 steps, arriving 5 s apart."""
    sizes = {"heavy": 32, "light-a": 4, "light-b": 4}
    tasks = [
        SimTask(f"{t}-{k}", 4, seqs, tenant=t, arrival_s=5.0 * (2 * i + k + seed % 2))
        for i, (t, seqs) in enumerate(sizes.items())
        for k in range(2)
    ]
    policy = POLICIES[service]
    r = simulate(
        tasks, TRUE, train_order=policy.train_order, concurrency=policy.concurrency
    )
    t0 = min(t.arrival_s for t in tasks)
    commits: dict[str, list[float]] = {}
    for s in r.steps:
        commits.setdefault(s["task"], []).append(s["t_commit"])
    ttfs = sorted(min(commits[t.name]) - t.arrival_s for t in tasks)
    trains = [e["end"] - e["start"] for e in r.events if e["phase"] == "train"]
    fit = {
        "seqs": {t.name: t.seqs for t in tasks},
        "events": [
            {**e, "start": e["start"] - t0, "end": e["end"] - t0}
            for e in r.events
            if e["phase"] in ("rollout", "train", "publish")
        ],
        "queue": [
            [e["task"], e["start"] - t0, e["end"] - t0]
            for e in r.events
            if e["phase"] == "queue"
        ],
        "jobs": [
            {
                "task": t.name,
                "tenant": t.tenant,
                "arrival_s": t.arrival_s - t0,
                "steps": 4,
            }
            for t in tasks
        ],
    }
    run = {
        "label": f"{service}@6/min.r{seed}",
        "service": service,
        "rate_per_min": 6.0,
        "status": "ok",
        "metrics": {
            "ttfs_p95_s": ttfs[-1] + 0.05 * (ttfs[-1] - ttfs[-2]),
            "steps_per_hour": len(r.steps)
            / (max(max(c) for c in commits.values()) - t0)
            * 3600,
            "step_s": sum(trains) / len(trains),
        },
    }
    return run, fit


@pytest.fixture(scope="module")
def bench() -> tuple[dict, dict]:
    runs, fits = [], {}
    for service in ("async", "fair"):
        for seed in range(2):
            run, fit = measured_run(seed, service)
            runs.append(run)
            fits[run["label"]] = fit
    load = {"tenants": [{"name": t} for t in ("heavy", "light-a", "light-b")]}
    return {"load": load, "runs": runs}, fits


def test_the_fit_input_round_trips(bench):
    _, fits = bench
    fit = next(iter(fits.values()))
    fit = {
        **fit,
        "events": [
            [e[k] for k in ("phase", "task", "version", "start", "end")]
            for e in fit["events"]
        ],
    }
    text = dump_service_fit({"x": fit})
    back = load_service_fit(text)["x"]
    assert back["jobs"] == fit["jobs"] and back["queue"] == fit["queue"]
    assert back["events"][0]["phase"] == fit["events"][0][0]
    with pytest.raises(ValueError, match="bench-service fit_input.json"):
        load_service_fit(json.dumps({"format": 1, "fields": [], "runs": {"a": {}}}))


def test_the_fit_recovers_the_step_times_it_was_made_with(bench):
    result, fits = bench
    models = fit_service_models(
        [fits[r["label"]] for r in result["runs"] if r["service"] == "async"]
    )
    assert models.latency.train_s(32, "heavy") == pytest.approx(2.0 + 8.0, rel=0.05)
    assert models.latency.train_s(4, "light-a") == pytest.approx(3.0, rel=0.05)
    assert models.setup_s == pytest.approx(0.0, abs=1e-6)


def test_fit_on_async_predicts_fair_and_projects_every_policy(bench):
    result, fits = bench
    out = simulate_service(result, fits, "async", scales=(6, 12))
    oos = out["errors"]["steps_per_hour"]["out_of_sample"]
    assert oos["runs"] == 2 and oos["mean_abs_rel_error"] < 0.05
    ttfs = out["errors"]["ttfs_p95_s"]["out_of_sample"]
    assert ttfs["mean_abs_rel_error"] < 0.10
    rows = {(p["tenants"], p["service"]): p for p in out["projection"]}
    assert set(rows) == {
        (n, s) for n in (6, 12) for s in ("async", "fair", "fair_adaptive")
    }
    assert rows[(12, "async")]["trainers"] == 4  # 3 tenants per trainer, as measured
    assert all(p["jain"] is None or 0 < p["jain"] <= 1 for p in rows.values())


def test_the_fair_policy_evens_out_backlogged_tenants_where_fifo_does_not():
    """A heavy tenant (10 s steps) and a light one (3 s), three jobs each and
    short rollouts, so both stay backlogged: FIFO gives the heavy one about
    10/13 of the trainer (Jain 0.79), fair about half each (0.95: a window
    of 4 mean steps holds whole steps only)."""
    from areal_marlaas.sim.service import ServiceModels, sim_metrics

    tasks = [
        SimTask(f"{t}{k}", 8, seqs, profile=t, tenant=t)
        for t, seqs in (("heavy", 32), ("light", 4))
        for k in range(3)
    ]
    quick = LatencyModels(
        rollout=RolloutModel(work_s=0.5, beta=1.0),
        train_intercept_s=2.0,
        train_per_seq_s=0.25,
    )
    models = ServiceModels(quick, setup_s=0.0)
    fifo = sim_metrics(tasks, models, POLICIES["async"])["jain"]
    fair = sim_metrics(tasks, models, POLICIES["fair"])["jain"]
    assert fifo < 0.8 < 0.9 < fair


def test_the_command_writes_its_report_and_names_a_missing_service(
    bench, tmp_path, capsys
):
    result, fits = bench
    (tmp_path / "bench_service.json").write_text(json.dumps(result))
    rows = {}
    for label, fit in fits.items():
        rows[label] = {
            **fit,
            "events": [
                [e[k] for k in ("phase", "task", "version", "start", "end")]
                for e in fit["events"]
            ],
        }
    (tmp_path / "fit_input.json").write_text(dump_service_fit(rows))
    out = ["--out", str(tmp_path / "sim_service.json")]
    assert marlaas(["simulate-service", str(tmp_path), "--tenants", "6", *out]) == 0
    md = (tmp_path / "sim_service.md").read_text()
    assert "| 6 | 12 | 2 | fair_adaptive |" in md
    rc = marlaas(["simulate-service", str(tmp_path), "--fit-service", "async_first"])
    assert rc == 2
    assert "no successful 'async_first' run" in capsys.readouterr().err
