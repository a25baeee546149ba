"""Bench metrics from a synthetic run directory, with hand-computed numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from areal_marlaas.bench.run_metrics import (
    load_run,
    percentile,
    ratios,
    run_metrics,
    union_length,
    utilization,
)
from areal_marlaas.config import ConfigError
from areal_marlaas.rundir.phases import phase_stats
from tests.support.bench import BENCH_YAML

T0 = 1000.0


def _ev(task, version, phase, start, end):
    return {
        "task": task,
        "version": version,
        "phase": phase,
        "start": T0 + start,
        "end": T0 + end,
    }


# Two tasks, two steps each (times relative to T0):
#   a: rollout 0-10, train 10-20, publish 20-21, rollout 21-31, train 31-41, pub -42
#   b: rollout 0-12, queue 12-20, train 20-30, publish 30-31, rollout 31-35,
#      queue 35-41, train 41-50, publish 50-51
EVENTS = [
    {"task": "a", "version": 0, "admission": "admit", "t": T0 - 1},  # no "phase"
    _ev("a", 0, "rollout", 0, 10),
    _ev("b", 0, "rollout", 0, 12),
    _ev("a", 0, "queue", 10, 10),
    _ev("a", 0, "train", 10, 20),
    _ev("a", 1, "publish", 20, 21),
    _ev("b", 0, "queue", 12, 20),
    _ev("b", 0, "train", 20, 30),
    _ev("b", 1, "publish", 30, 31),
    _ev("a", 1, "rollout", 21, 31),
    _ev("a", 1, "queue", 31, 31),
    _ev("a", 1, "train", 31, 41),
    _ev("a", 2, "publish", 41, 42),
    _ev("b", 1, "rollout", 31, 35),
    _ev("b", 1, "queue", 35, 41),
    _ev("b", 1, "train", 41, 50),
    _ev("b", 2, "publish", 50, 51),
    {"task": "b", "status": "failed", "reason": "x", "t": T0 + 60},  # no "phase"
]
STEPS = [
    {"task": "a", "version": 1, "t_commit": T0 + 20, "n_trajectories": 8},
    {"task": "b", "version": 1, "t_commit": T0 + 30, "n_trajectories": 8},
    {"task": "a", "version": 2, "t_commit": T0 + 41, "n_trajectories": 8},
    {"task": "b", "version": 2, "t_commit": T0 + 50, "n_trajectories": 8},
]
SAMPLES = [
    {"t": T0 - 5, "server_cpu": 0.0, "trainer_cpu": 0.0, "running": 0},
    {"t": T0, "server_cpu": 0.0, "trainer_cpu": 0.0, "running": 5},
    {"t": T0 + 25.5, "server_cpu": 10.0, "trainer_cpu": 20.0, "running": 0},
    {"t": T0 + 51, "server_cpu": 20.4, "trainer_cpu": 40.8, "running": 3},
    {"t": T0 + 60, "server_cpu": 30.0, "trainer_cpu": 41.0, "running": 0},
]


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    (tmp_path / "events.jsonl").write_text(
        "".join(json.dumps(e) + "\n" for e in EVENTS)
    )
    (tmp_path / "steps.jsonl").write_text("".join(json.dumps(s) + "\n" for s in STEPS))
    (tmp_path / "summary.json").write_text(
        json.dumps({"mode": "async", "wall_s": 51.0, "tasks": {}})
    )
    return tmp_path


def test_run_metrics_synthetic_run_exact_numbers(run_dir):
    m = run_metrics(load_run(run_dir), SAMPLES, cores=(1, 1, 2))
    assert m["steps"] == 4
    assert m["wall_s"] == 51.0
    assert m["window_s"] == 51.0
    assert m["train_steps_per_hour"] == pytest.approx(4 / 51 * 3600)
    assert m["ttfs_s"] == {"a": 20.0, "b": 30.0}
    assert m["ttfs_p50_s"] == 25.0
    assert m["ttfs_max_s"] == 30.0
    # gaps: a 41-20 = 21, b 50-30 = 20
    assert m["tpts_p50_s"] == pytest.approx(20.5)
    assert m["tpts_p95_s"] == pytest.approx(20.95)
    assert m["phase_p50_s"]["train"] == 10.0
    assert m["phase_p50_s"]["queue"] == 3.0  # 0, 8, 0, 6
    assert m["train_busy_events"] == pytest.approx(39 / 51)
    assert m["rollout_busy_events"] == pytest.approx(26 / 51)
    assert m["rollout_util_cpu"] == pytest.approx(0.4)
    assert m["train_util_cpu"] == pytest.approx(0.8)
    assert m["idle_pct"] == pytest.approx(40.0)
    assert m["rollout_busy_gauge"] == pytest.approx(2 / 3)
    assert "failed_tasks" not in m


def test_trainer_bound_and_elastic_cores_exact_numbers(run_dir):
    m = run_metrics(load_run(run_dir), SAMPLES, cores=(1, 1, 2))
    # First rollout back at 10 s, then 10 + 10 + 10 + 9 s of training in a row.
    assert m["trainer_bound_s"] == pytest.approx(49.0)
    assert m["bound_efficiency"] == pytest.approx(49 / 51)
    assert "train_cores_mean" not in m  # steps that record no cores
    timed = [
        {**s, "train_s": t, "cores_mean": c, "borrowed_s": b}
        for s, t, c, b in zip(
            STEPS, (10, 10, 10, 10), (2.0, 1.0, 1.5, 1.5), (10, 0, 5, 5), strict=False
        )
    ]
    (run_dir / "steps.jsonl").write_text("".join(json.dumps(s) + "\n" for s in timed))
    m = run_metrics(load_run(run_dir), SAMPLES, cores=(1, 1, 2))
    assert m["train_cores_mean"] == pytest.approx(1.5)
    assert m["borrowed_share"] == pytest.approx(0.5)


def test_trainer_bound_with_two_trainers_is_the_busiest_ones(run_dir):
    # a on trainer 0 (10 + 10 s of training), b on trainer 1 (10 + 9 s).
    placed = [{**s, "trainer": 0 if s["task"] == "a" else 1} for s in STEPS]
    (run_dir / "steps.jsonl").write_text("".join(json.dumps(s) + "\n" for s in placed))
    m = run_metrics(load_run(run_dir), SAMPLES, cores=(1, 1, 2))
    assert m["trainer_bound_s"] == pytest.approx(10.0 + 20.0)
    assert m["bound_efficiency"] == pytest.approx(30 / 51)


def test_run_metrics_without_summary_uses_window(run_dir):
    (run_dir / "summary.json").unlink()
    m = run_metrics(load_run(run_dir))
    assert m["wall_s"] == 51.0
    assert m["rollout_util_cpu"] is None


def test_run_metrics_failed_task_is_reported(run_dir):
    (run_dir / "summary.json").write_text(
        json.dumps(
            {
                "wall_s": 51.0,
                "tasks": {
                    "a": {"status": "done"},
                    "b": {"status": "failed", "error": "boom"},
                },
            }
        )
    )
    assert run_metrics(load_run(run_dir))["failed_tasks"] == {"b": "boom"}


def test_utilization_window_between_samples_interpolates():
    # server 10 CPU-s over 25.5 s: [0, 12.75] holds 5 CPU-s on 2 cores
    u = utilization(SAMPLES, T0, T0 + 12.75, 2, 1, 2)
    assert u["rollout_util_cpu"] == pytest.approx(5 / (12.75 * 2))
    assert u["train_util_cpu"] == pytest.approx(10 / 12.75)
    assert u["rollout_busy_gauge"] == 1.0  # only the t=T0 sample, running 5


def test_percentile_and_union_match_hand_values():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([10], 95) == 10
    assert percentile([], 50) is None
    assert union_length([(0, 2), (1, 3), (5, 6)]) == 4


def test_ratios_vs_sequential():
    r = ratios(
        {
            "sequential": {"wall_s": 100.0, "train_steps_per_hour": 36.0},
            "async": {"wall_s": 40.0, "train_steps_per_hour": 90.0},
            "broken": {"wall_s": None, "train_steps_per_hour": None},
        }
    )
    assert r["sequential"]["speedup_vs_sequential"] == 1.0
    assert r["async"]["speedup_vs_sequential"] == 2.5
    assert r["async"]["throughput_vs_sequential"] == 2.5
    assert r["broken"]["speedup_vs_sequential"] is None


@pytest.fixture
def bench_yaml(tmp_path: Path) -> Path:
    p = tmp_path / "bench.yaml"
    p.write_text(BENCH_YAML)
    return p


def test_plan_runs_replicas_modes_ablation_and_sweep(bench_yaml):
    from areal_marlaas.bench.plan import plan_runs
    from areal_marlaas.bench.run import load_bench_config

    bench, cfg, _, overrides = load_bench_config(
        ["--config", str(bench_yaml), "tasks.0.batch_size=4"]
    )
    plans = plan_runs(bench, cfg)
    assert [p.label for p in plans] == [
        "async",
        "sync",
        "sequential",
        "collocated",
        "async_no_multi_lora",
        "async_c1",
        "async_c2",
        "async_c4",
    ]
    tasks = plans[0].tasks
    assert [t.name for t in tasks] == [f"mul1_{i}" for i in range(8)]
    assert [t.seed for t in tasks] == list(range(11, 19))
    assert {t.total_steps for t in tasks} == {3}
    assert {t.batch_size for t in tasks} == {4}  # the override reached the tasks
    assert plans[3].placement == "collocated"
    assert plans[4].overrides == {"scheduler.multi_lora": "false"}
    assert [t.name for t in plans[6].tasks] == ["mul1_0", "mul1_1"]
    assert overrides == ["tasks.0.batch_size=4"]


def test_plan_runs_task_mix_kept_then_cycled(bench_yaml):
    from areal_marlaas.bench.plan import plan_runs
    from areal_marlaas.bench.run import load_bench_config

    bench, cfg, _, _ = load_bench_config(
        ["--config", str(bench_yaml), "bench.task=", "bench.replicas=3"]
    )
    plans = plan_runs(bench, cfg)
    assert [t.name for t in plans[0].tasks] == ["mul1", "add1", "mul1_2"]
    assert plans[0].tasks[2].seed == 13


@pytest.mark.parametrize(
    "override, match",
    [
        ("bench.modes=[async,turbo]", "bench.modes: unknown mode 'turbo'"),
        ("bench.ablations=[no_async]", "bench.ablations: unknown ablation"),
        ("bench.concurrency=[0,2]", "bench.concurrency"),
        ("bench.replicas=-1", "bench.replicas"),
        ("bench.nonsense=1", "bench.nonsense"),
    ],
)
def test_bench_config_bad_value_names_the_field(bench_yaml, override, match):
    from areal_marlaas.bench.run import load_bench_config

    with pytest.raises(ConfigError, match=match):
        load_bench_config(["--config", str(bench_yaml), override])


def test_bench_schedulers_accept_a_bare_null(bench_yaml):
    """`bench.schedulers=[null,local]` (YAML null) means in-process, like 'null'."""
    from areal_marlaas.bench.plan import plan_runs
    from areal_marlaas.bench.run import load_bench_config

    argv = ["--config", str(bench_yaml), "bench.schedulers=[null,local]"]
    bench, cfg, _, _ = load_bench_config(argv + ["bench.concurrency=[]"])
    assert bench.schedulers == ["null", "local"]
    labels = [p.label for p in plan_runs(bench, cfg)]
    assert "async" in labels and "async@local" in labels


def test_two_trainers_ablation_runs_on_the_local_scheduler(bench_yaml):
    """Its baseline is async@local: the same trainer-worker placement."""
    from areal_marlaas.bench.plan import plan_runs
    from areal_marlaas.bench.run import load_bench_config

    argv = ["--config", str(bench_yaml), "bench.modes=[async]"]
    argv += ["bench.schedulers=[local]", "bench.ablations=[two_trainers]"]
    bench, cfg, _, _ = load_bench_config(argv + ["bench.concurrency=[]"])
    plans = {p.label: p for p in plan_runs(bench, cfg)}
    assert sorted(plans) == ["async@local", "async_two_trainers"]
    two = plans["async_two_trainers"]
    assert (two.scheduler, two.overrides) == ("local", {"scheduler.trainers": "2"})
    assert plans["async@local"].placement == two.placement


def test_glibc_heap_ablation_turns_the_kept_heap_off_beside_async(bench_yaml):
    from areal_marlaas.bench.plan import plan_runs
    from areal_marlaas.bench.run import load_bench_config

    argv = ["--config", str(bench_yaml), "bench.modes=[async]"]
    argv += ["bench.ablations=[glibc_heap]", "bench.concurrency=[]"]
    bench, cfg, _, _ = load_bench_config(argv)
    plans = {p.label: p for p in plan_runs(bench, cfg)}
    assert sorted(plans) == ["async", "async_glibc_heap"]
    heap = plans["async_glibc_heap"]
    assert heap.overrides == {"keep_freed_pages": "false"}
    assert heap.scheduler == plans["async"].scheduler == "null"
    assert cfg.keep_freed_pages  # the mode run keeps the default


def test_bench_config_unknown_task_lists_names(bench_yaml):
    from areal_marlaas.bench.plan import plan_runs
    from areal_marlaas.bench.run import load_bench_config

    bench, cfg, _, _ = load_bench_config(
        ["--config", str(bench_yaml), "bench.task=nope"]
    )
    with pytest.raises(ConfigError, match="no task named 'nope'"):
        plan_runs(bench, cfg)


def test_outputs_written_small_with_plots(tmp_path, run_dir):
    pytest.importorskip("matplotlib")
    from areal_marlaas.bench.report import compact_run, write_outputs

    out = tmp_path / "out"
    run = load_run(run_dir)
    runs = []
    for label, mode, group in [
        ("async", "async", "mode"),
        ("sequential", "sequential", "mode"),
        ("async_c1", "async", "sweep"),
    ]:
        compact_run(run, SAMPLES, out / "runs" / label, 400)
        runs.append(
            {
                "label": label,
                "mode": mode,
                "placement": "disaggregated",
                "group": group,
                "tenants": 2,
                "status": "ok",
                "cores": {"server": 1, "trainer": 1, "total": 2},
                "metrics": run_metrics(run, SAMPLES),
                "phases": phase_stats(run_dir),
            }
        )
    result = {
        "bench": {
            "task": "mul1",
            "replicas": 2,
            "steps": 2,
            "server_cpus": "0",
            "trainer_cpus": "1",
            "collocated_cpus": "0-1",
        },
        "model": "/m/SmolLM2",
        "runs": runs,
        "sweep": {"1": "async_c1", "2": "async"},
    }
    write_outputs(result, out)
    for name in ("bench.json", "bench.md", "timeline.png", "utilization.png"):
        assert (out / name).is_file(), name
    assert (out / "concurrency.png").is_file()
    # What the simulator fits from once runs/ is left out of a committed result.
    fit = json.loads((out / "fit_input.json").read_text())["runs"]
    assert set(fit) == {"async", "sequential", "async_c1"}
    assert len(fit["async"]["events"]) == sum(
        e.get("phase") in ("rollout", "env", "train", "publish") for e in run["events"]
    )
    md = (out / "bench.md").read_text()
    # Per-task rows from the events: b queued 8 s then 6 s, a never waited.
    assert "| async | b | 2 | 8.0 | 0.0 | 7.0 | 9.5 | 1.0 |" in md
    assert "| async | a | 2 | 10.0 | 0.0 | 0.0 | 10.0 | 1.0 |" in md
    compact = load_run(out / "runs" / "async")
    assert compact["events"][1]["start"] == 0.0
    assert run_metrics(compact)["ttfs_p50_s"] == 25.0
    assert (
        "| async | async | disaggregated | 2 | ok | 51.0 |"
        in (out / "bench.md").read_text()
    )
    assert sum(p.stat().st_size for p in out.rglob("*")) < 3 * 2**20


def test_eval_overlap_counts_evals_whose_next_rollout_started_before_they_ended():
    from areal_marlaas.bench.run_metrics import eval_overlap

    phases = [
        {"task": "a", "version": 1, "phase": "eval", "start": 10.0, "end": 14.0},
        {"task": "a", "version": 1, "phase": "rollout", "start": 10.1, "end": 12.0},
        {"task": "b", "version": 1, "phase": "eval", "start": 10.0, "end": 11.0},
        {"task": "b", "version": 1, "phase": "rollout", "start": 11.5, "end": 13.0},
        # a's last eval: no next rollout, not counted in the share.
        {"task": "a", "version": 2, "phase": "eval", "start": 20.0, "end": 22.0},
    ]
    out = eval_overlap(phases)
    assert out["evals"] == 3 and out["eval_p50_s"] == 2.0
    assert out["evals_beside_next_rollout"] == 0.5
    assert eval_overlap(phases[1:2]) == {}


def test_the_evals_ablation_adds_held_out_evals_to_the_same_tasks():
    from areal_marlaas.bench.plan import with_evals
    from areal_marlaas.config.tasks import TaskDatasetConfig, TaskSpec

    t = TaskSpec(name="m", kind="multiplication", dataset=TaskDatasetConfig(digits=1))
    (e,) = with_evals([t], 6)
    assert (e.eval_interval, e.eval_samples) == (1, 6)
    assert e.eval_dataset is not None and e.eval_dataset.split == "test"
    assert e.dataset == t.dataset and e.batch_size == t.batch_size


def test_the_evals_local_ablation_evaluates_with_local_scheduler_workers(bench_yaml):
    from areal_marlaas.bench.plan import plan_runs
    from areal_marlaas.bench.run import load_bench_config

    bench, cfg, _, _ = load_bench_config(
        [
            "--config",
            str(bench_yaml),
            "bench.ablations=[evals_local]",
            "bench.modes=[async]",
            "bench.schedulers=[local]",
            "bench.concurrency=[]",
        ]
    )
    base, evals = plan_runs(bench, cfg)
    assert (base.label, evals.label) == ("async@local", "async_evals_local")
    assert base.scheduler == evals.scheduler == "local"
    assert {t.eval_interval for t in evals.tasks} == {1}
    assert {t.eval_interval for t in base.tasks} == {0}
