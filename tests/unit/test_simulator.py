"""The discrete-event simulator drives the real SchedulerCore: hand-computed
timelines with fixed latencies, model fits that recover known parameters, and
admission limits."""

from __future__ import annotations

import json
import math

import pytest

from areal_marlaas.scheduler.core import MODES
from areal_marlaas.sim.latency import (
    LatencyModels,
    RolloutModel,
    RunLog,
    fit_models,
    fit_rollout,
)
from areal_marlaas.sim.simulator import SimTask, simulate


def fixed(rollout=4.0, train=3.0, publish=1.0) -> LatencyModels:
    # beta = 1: the server's speed grows with its batch, so a batch takes `work`
    # seconds whatever else runs beside it.
    return LatencyModels(
        rollout=RolloutModel(work_s=rollout, beta=1.0),
        train_intercept_s=train,
        publish_s=publish,
    )


def commits(result) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for s in result.steps:
        out.setdefault(s["task"], []).append(s["t_commit"])
    return out


TWO = [SimTask("a", 2, 4), SimTask("b", 2, 4)]


def test_async_two_tasks_hand_computed_timeline():
    # a,b roll out 0-4; a trains 4-7, b 7-10; a publishes 7-8, rolls 8-12,
    # trains 12-15, publishes 15-16; b publishes 10-11, rolls 11-15, trains
    # 15-18, publishes 18-19.
    r = simulate(TWO, fixed(), "async")
    assert r.wall_s == pytest.approx(19.0)
    assert commits(r) == {"a": [7.0, 15.0], "b": [10.0, 18.0]}
    queue_b0 = [e for e in r.events if e["phase"] == "queue" and e["task"] == "b"][0]
    assert (queue_b0["start"], queue_b0["end"]) == (4.0, 7.0)
    m = r.metrics()
    assert m["ttfs_p50_s"] == pytest.approx(8.5)
    assert m["tpts_p50_s"] == pytest.approx(8.0)


def test_sync_two_tasks_waits_at_both_barriers():
    # round 0: rollouts 0-4, trains 4-7 and 7-10, publishes end 8 and 11;
    # round 1 starts at 11: rollouts 11-15, trains 15-18 and 18-21, last publish 22.
    r = simulate(TWO, fixed(), "sync")
    assert r.wall_s == pytest.approx(22.0)
    assert commits(r) == {"a": [7.0, 18.0], "b": [10.0, 21.0]}


@pytest.mark.parametrize("mode", ["sequential", "collocated"])
def test_sequential_runs_one_task_after_another(mode):
    # each task: (4 + 3 + 1) x 2 = 16 s, b after a
    r = simulate(TWO, fixed(), mode)
    assert r.wall_s == pytest.approx(32.0)
    assert commits(r) == {"a": [7.0, 15.0], "b": [23.0, 31.0]}
    waits = [
        (e["task"], e["start"], e["end"]) for e in r.events if e["phase"] == "wait"
    ]
    assert waits == [("b", 0.0, 16.0)]


def test_three_tasks_one_step_async_overlaps_sequential_does_not():
    tasks = [SimTask(n, 1, 4) for n in "abc"]
    assert simulate(tasks, fixed(), "async").wall_s == pytest.approx(14.0)
    assert simulate(tasks, fixed(), "sync").wall_s == pytest.approx(14.0)
    assert simulate(tasks, fixed(), "sequential").wall_s == pytest.approx(24.0)


def test_two_trainers_train_in_parallel():
    r = simulate(TWO, fixed(), "async", trainers=2)
    # both train 4-7, publish 7-8, roll 8-12, train 12-15, publish 15-16
    assert r.wall_s == pytest.approx(16.0)


def test_a_task_waits_for_its_own_trainer_while_the_other_idles():
    # a and c are placed on trainer 0, b on trainer 1; b's tool calls take 10 s.
    # a trains 4-7; c, ready at 4, waits for trainer 0 (7-10) although trainer
    # 1 idles until b is ready at 14 (trains 14-17, publishes 17-18).
    tasks = [SimTask("a", 1, 4), SimTask("b", 1, 4, env_s=10.0), SimTask("c", 1, 4)]
    r = simulate(tasks, fixed(), "async", trainers=2)
    assert commits(r) == {"a": [7.0], "c": [10.0], "b": [17.0]}
    assert r.wall_s == pytest.approx(18.0)


def test_processor_sharing_batch_slows_with_company():
    m = LatencyModels(RolloutModel(work_s=1.0, beta=0.5), train_intercept_s=1.0)
    alone = simulate([SimTask("a", 1, 4)], m, "async")
    rolls = [e for e in alone.events if e["phase"] == "rollout"]
    assert rolls[0]["end"] == pytest.approx(4 / 4**0.5)
    both = simulate([SimTask("a", 1, 4), SimTask("b", 1, 4)], m, "async")
    ends = [e["end"] for e in both.events if e["phase"] == "rollout"]
    assert ends == pytest.approx([8 / 8**0.5] * 2)
    # two devices: each batch alone again
    two = simulate([SimTask("a", 1, 4), SimTask("b", 1, 4)], m, rollout_devices=2)
    ends = [e["end"] for e in two.events if e["phase"] == "rollout"]
    assert ends == pytest.approx([2.0, 2.0])


def _max_overlap(events) -> int:
    points = []
    for e in events:
        if e["phase"] == "rollout":
            points += [(e["start"], 1), (e["end"], -1)]
    cur = best = 0
    for _, d in sorted(points, key=lambda p: (p[0], p[1])):
        cur += d
        best = max(best, cur)
    return best


def test_kv_budget_limits_concurrent_rollouts():
    tasks = [SimTask(n, 2, 4, kv_bytes=60) for n in "abc"]
    free = simulate(tasks, fixed(), "async")
    assert _max_overlap(free.events) == 3
    tight = simulate(tasks, fixed(), "async", kv_budget=100)
    assert _max_overlap(tight.events) == 1
    assert tight.holds > 0
    assert tight.wall_s > free.wall_s
    two = simulate(tasks, fixed(), "async", kv_budget=120)
    assert _max_overlap(two.events) == 2
    assert len(two.steps) == 6


def test_max_rolling_one_is_one_adapter_per_batch():
    tasks = [SimTask(n, 1, 4) for n in "abc"]
    r = simulate(tasks, fixed(), "async", max_rolling=1)
    assert _max_overlap(r.events) == 1
    assert len(r.steps) == 3


def test_kv_budget_below_one_batch_is_refused():
    from areal_marlaas.scheduler.core import AdmissionError

    with pytest.raises(AdmissionError):
        simulate([SimTask("a", 1, 4, kv_bytes=200)], fixed(), kv_budget=100)


def _group_events(k: int, seqs: int, t0: float, d: float) -> list[dict]:
    """k tasks of `seqs` sequences rolling out together from t0 for d seconds,
    then training one after another."""
    out = []
    for i in range(k):
        name = f"k{k}_{i}"
        out.append(
            {"task": name, "version": 0, "phase": "rollout", "start": t0, "end": t0 + d}
        )
        ts = t0 + d + 2.0 * i
        out.append(
            {"task": name, "version": 0, "phase": "train", "start": ts, "end": ts + 2}
        )
        out.append(
            {
                "task": name,
                "version": 1,
                "phase": "publish",
                "start": ts + 2,
                "end": ts + 2.1,
            }
        )
    return out


@pytest.mark.parametrize("beta, work, overhead", [(0.3, 0.5, 0.0), (0.6, 0.2, 0.8)])
def test_fit_rollout_recovers_known_parameters(beta, work, overhead):
    seqs = 8
    truth = RolloutModel(work_s=work, beta=beta, overhead_s=overhead)
    logs = []
    t = 0.0
    for k in (1, 2, 4, 8):
        d = truth.duration(k * seqs)
        ev = _group_events(k, seqs, t, d)
        logs.append(RunLog(ev, {e["task"]: seqs for e in ev}))
        t += 1000
    model, diag = fit_rollout(logs)
    assert model.beta_fitted
    assert model.beta == pytest.approx(beta, abs=0.02)
    assert model.work_s == pytest.approx(work, rel=0.1)
    assert model.overhead_s == pytest.approx(overhead, abs=0.1 * max(d, 1))
    assert diag["rmse_s"] < 0.05 * d
    for k in (1, 3, 8):
        assert model.duration(k * seqs) == pytest.approx(
            truth.duration(k * seqs), rel=0.03
        )


def test_fit_models_train_line_publish_mean_and_default_beta():
    ev, seqs = [], {}
    for i, (s, d) in enumerate([(8, 3.0), (16, 5.0), (8, 3.0), (24, 7.0)]):
        name = f"t{i}"
        seqs[name] = s
        base = 100.0 * i
        ev += [
            {
                "task": name,
                "version": 0,
                "phase": "rollout",
                "start": base,
                "end": base + 2,
            },
            {
                "task": name,
                "version": 0,
                "phase": "train",
                "start": base + 2,
                "end": base + 2 + d,
            },
            {
                "task": name,
                "version": 1,
                "phase": "publish",
                "start": base + 2 + d,
                "end": base + 2.5 + d,
            },
            {"task": name, "version": 1, "admission": "admit", "t": base},
        ]
    m = fit_models([RunLog(ev, seqs)])
    assert m.train_per_seq_s == pytest.approx(0.25)
    assert m.train_intercept_s == pytest.approx(1.0)
    assert m.publish_s == pytest.approx(0.5)
    # concurrency spread is only 8..24 but no overlap: fitted
    assert m.rollout.beta_fitted
    same = fit_models([RunLog(ev, {n: 8 for n in seqs})])
    assert not same.rollout.beta_fitted
    assert same.rollout.beta == pytest.approx(math.log(1.6) / math.log(4))
    assert LatencyModels.from_dict(m.to_dict()) == m


def _truth(train_s: float = 9.0) -> LatencyModels:
    return LatencyModels(
        RolloutModel(work_s=0.6, beta=0.35, overhead_s=0.5, max_seqs=128),
        train_intercept_s=train_s,
        publish_s=0.05,
    )


RUNS = [
    ("async", "async", 4),
    ("sync", "sync", 4),
    ("sequential", "sequential", 4),
    ("async_c1", "async", 1),
    ("async_c2", "async", 2),
]


def write_bench(
    root, truth_of, plan=RUNS, steps: int = 2, overrides=None, bench=None
) -> None:
    """A bench folder whose runs are the simulator's own output under known
    models (``truth_of(mode)``); ``bench``: its bench config (e.g. replicas)."""
    runs = []
    for label, mode, n in plan:
        tasks = [SimTask(f"m_{i}", steps, 16, 32) for i in range(n)]
        r = simulate(tasks, truth_of(mode), mode)
        d = root / "runs" / label
        d.mkdir(parents=True)
        (d / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in r.events))
        (d / "steps.jsonl").write_text("".join(json.dumps(s) + "\n" for s in r.steps))
        runs.append(
            {
                "label": label,
                "mode": mode,
                "placement": "disaggregated",
                "tenants": n,
                "status": "ok",
                "tasks": [
                    {
                        "name": t.name,
                        "batch_size": 4,
                        "n_samples": 4,
                        "max_new_tokens": 32,
                        "total_steps": steps,
                        "kv_bytes": 100,
                    }
                    for t in tasks
                ],
                "overrides": (overrides or {}).get(label, {}),
                "metrics": r.metrics(),
            }
        )
    (root / "bench.json").write_text(
        json.dumps(
            {
                "runs": runs,
                "kv_capacity_bytes": 250,
                "max_num_seqs": 128,
                **({"bench": bench} if bench else {}),
            }
        )
    )


def test_simulate_bench_validates_and_projects(tmp_path):
    """The fit reproduces every run's wall time, and the projection runs."""
    from areal_marlaas.sim.project import format_sim_markdown, simulate_bench

    write_bench(tmp_path, lambda mode: _truth())
    out = simulate_bench(tmp_path, [1, 8], rollout_devices=2, train_devices=2)
    assert len(out["validation"]) == 5
    for row in out["validation"]:
        assert abs(row["error_pct"]) < 2.0, row
    fitted = out["models"]["disaggregated"]
    assert fitted["rollout"]["beta"] == pytest.approx(0.35, abs=0.03)
    assert fitted["train_intercept_s"] == pytest.approx(9.0)
    proj = {(r["tenants"], r["mode"]): r for r in out["projection"]}
    assert set(proj) == {
        (n, m) for n in (1, 8) for m in ("async", "sync", "sequential", "collocated")
    }
    # 2 devices x 250 bytes admit 5 batches of 100 bytes: 8 tenants are held back
    assert proj[(8, "async")]["admission_holds"] > 0
    assert proj[(8, "async")]["wall_s"] < proj[(8, "sequential")]["wall_s"]
    assert "| async | async | 4 | in |" in format_sim_markdown(out)


def test_modes_left_out_of_the_fit_are_predicted_out_of_sample(tmp_path):
    """Fitted on the async runs only: sync is predicted from models it never
    saw; a sequential run whose train steps cost more than async's (what core
    contention would change) shows up as an out-of-sample error, not fitted
    away."""
    from areal_marlaas.sim.project import format_validation, simulate_bench

    write_bench(tmp_path, lambda mode: _truth(14.0 if mode == "sequential" else 9.0))
    out = simulate_bench(tmp_path, [1], fit_modes=["async"])
    rows = {r["label"]: r for r in out["validation"]}
    assert [rows[k]["in_sample"] for k in ("async", "async_c1", "async_c2")] == [
        True
    ] * 3
    assert not rows["sync"]["in_sample"] and not rows["sequential"]["in_sample"]
    assert out["models"]["disaggregated"]["train_intercept_s"] == pytest.approx(9.0)
    for k in ("async", "async_c1", "async_c2", "sync"):
        assert abs(rows[k]["error_pct"]) < 2.0, rows[k]
    assert rows["sequential"]["error_pct"] < -20, rows["sequential"]
    text = format_validation(out["validation"])
    assert "|error| out of sample (2 runs)" in text


def test_env_time_follows_generation_off_the_server():
    """A task's tool-call time comes after its batch's generation and holds no
    server share: alone it delays the commit by exactly that time, and the
    other task's batch (which shares the server) is not slowed."""
    alone = simulate([SimTask("a", 1, 4)], fixed(), "async")
    waits = simulate([SimTask("a", 1, 4, env_s=2.0)], fixed(), "async")
    assert commits(waits)["a"][0] == pytest.approx(commits(alone)["a"][0] + 2.0)
    envs = [e for e in waits.events if e["phase"] == "env"]
    assert [(e["start"], e["end"]) for e in envs] == [(4.0, 6.0)]
    shared = LatencyModels(RolloutModel(work_s=4.0, beta=0.0), 3.0, publish_s=1.0)
    pair = simulate(
        [SimTask("a", 1, 4, env_s=5.0), SimTask("b", 1, 4)], shared, "async"
    )
    rolled = {e["task"]: e["end"] for e in pair.events if e["phase"] == "rollout"}
    # beta 0: the server's rate is shared, both batches finish generating at 32 s
    # (8 sequences x 4 s); a's tool calls then add 5 s to a only.
    assert rolled == pytest.approx({"a": 37.0, "b": 32.0})


def test_env_time_is_fitted_per_task_from_the_tool_calls(tmp_path):
    """A bench whose first task waits 4 s on tools per batch: the fit finds 4 s
    for that task and none for the others, fits the server exactly as on the
    same bench without tool calls, and predicts the modes it never saw; the
    projection's replicas of that task wait on tools too."""
    from areal_marlaas.sim.project import format_models, simulate_bench

    def truth(mode):
        m = _truth()
        m.env_by_task = {"m_0": 4.0}
        return m

    write_bench(tmp_path / "env", truth)
    write_bench(tmp_path / "none", lambda mode: _truth())
    out = simulate_bench(tmp_path / "env", [2], fit_modes=["async"])
    none = simulate_bench(tmp_path / "none", [2], fit_modes=["async"])
    fitted = LatencyModels.from_dict(out["models"]["disaggregated"])
    assert fitted.env_by_task == pytest.approx({"m_0": 4.0})
    assert fitted.env_of("m_1") == 0.0
    plain = none["models"]["disaggregated"]["rollout"]
    assert fitted.rollout.work_s == pytest.approx(plain["work_s"], rel=1e-6)
    assert fitted.rollout.beta == plain["beta"]
    for row in out["validation"]:
        assert abs(row["error_pct"]) < 2.0, row
    assert "env m_0 4.00s per batch" in format_models({"d": fitted})
    # Sequential, 2 replicas x 2 steps: four batches each 4 s longer.
    wall = {
        name: {(r["tenants"], r["mode"]): r["wall_s"] for r in o["projection"]}
        for name, o in (("env", out), ("none", none))
    }
    extra = wall["env"][(2, "sequential")] - wall["none"][(2, "sequential")]
    assert extra == pytest.approx(16.0, abs=0.1)


def test_a_train_step_slows_while_sequences_generate():
    """train_contention 1: a step runs at half speed while another task's
    sequences generate. a (4 s rollout) trains from 4 s while b generates until
    8 s: 2 of its 3 alone-seconds take 4 s, the last one 1 s."""
    m = fixed()
    m.rollout.ref_max_new_tokens = 32
    m.train_contention = 1.0
    tasks = [SimTask("a", 1, 4, 32), SimTask("b", 1, 4, 64)]
    r = simulate(tasks, m, "async")
    trains = {
        e["task"]: (e["start"], e["end"]) for e in r.events if e["phase"] == "train"
    }
    assert trains == {"a": pytest.approx((4.0, 9.0)), "b": pytest.approx((9.0, 12.0))}
    m.train_contention = 0.0
    plain = simulate(tasks, m, "async")
    trains = {e["task"]: e["end"] for e in plain.events if e["phase"] == "train"}
    assert trains == pytest.approx({"a": 7.0, "b": 11.0})


def spans(r) -> dict[tuple[str, str], tuple[float, float]]:
    """(task, phase) -> (start, end) of a run's rollouts and train steps."""
    return {
        (e["task"], e["phase"]): (e["start"], e["end"])
        for e in r.events
        if e["phase"] in ("rollout", "train")
    }


def test_paired_machines_slow_only_their_own_pair():
    """The same two tasks on two machines (a on trainer and device 0, b on 1):
    a's step no longer shares a machine with b's generation, so it takes its
    3 s; b's step, with nothing generating beside it, too."""
    m = fixed()
    m.rollout.ref_max_new_tokens = 32
    m.train_contention = 1.0
    m.rollout.contention = 1.0
    tasks = [SimTask("a", 1, 4, 32), SimTask("b", 1, 4, 64)]
    r = simulate(tasks, m, "async", rollout_devices=2, trainers=2, paired=True)
    assert spans(r) == {
        ("a", "rollout"): pytest.approx((0.0, 4.0)),
        ("a", "train"): pytest.approx((4.0, 7.0)),
        ("b", "rollout"): pytest.approx((0.0, 8.0)),
        ("b", "train"): pytest.approx((8.0, 11.0)),
    }
    with pytest.raises(ValueError, match="as many rollout devices as trainers"):
        simulate(tasks, m, "async", rollout_devices=1, trainers=2, paired=True)


def test_generation_slows_while_a_step_trains():
    """rollout.contention 1: sequences generate at half speed while a step
    trains. a (4 s) trains from 4 to 7 s; b (8 s of work) did 4 s of it by 4 s,
    1.5 s more by 7 s, the last 2.5 s by 9.5 s."""
    m = fixed()
    m.rollout.ref_max_new_tokens = 32
    m.rollout.contention = 1.0
    tasks = [SimTask("a", 1, 4, 32), SimTask("b", 1, 4, 64)]
    r = simulate(tasks, m, "async")
    assert spans(r) == {
        ("a", "rollout"): pytest.approx((0.0, 4.0)),
        ("a", "train"): pytest.approx((4.0, 7.0)),
        ("b", "rollout"): pytest.approx((0.0, 9.5)),
        ("b", "train"): pytest.approx((9.5, 12.5)),
    }


def test_per_task_latencies_and_train_contention_are_fitted(tmp_path):
    """A bench whose m_0 needs twice the shared work per sequence, whose m_1
    trains for 15 s instead of 9, and whose train steps and generation run 1.5x
    slower while both run: the async runs alone recover all three, and the sync
    and sequential runs (nothing overlaps generation there) are predicted."""
    from areal_marlaas.sim.project import format_models, simulate_bench

    def truth(mode):
        m = _truth()
        # No request overhead: the rollout records are then the generation
        # itself (with one, the fit counts it as generating and reads less
        # contention than there is).
        m.rollout.overhead_s = 0.0
        m.rollout.work_by_task = {"m_0": 1.2}
        m.train_by_task = {"m_1": 15.0}
        m.train_contention = m.rollout.contention = 0.5
        return m

    write_bench(tmp_path, truth)
    out = simulate_bench(tmp_path, [2], fit_modes=["async"])
    fitted = LatencyModels.from_dict(out["models"]["disaggregated"])
    assert fitted.train_contention == pytest.approx(0.5, abs=0.05)
    assert fitted.rollout.contention == fitted.train_contention
    assert fitted.train_by_task["m_1"] == pytest.approx(15.0, rel=0.03)
    assert fitted.train_by_task["m_0"] == pytest.approx(9.0, rel=0.03)
    # Work trades off against beta in the fit; the tasks' ratio is what shows.
    ratio = fitted.rollout.work_of(32, "m_0") / fitted.rollout.work_of(32, "m_2")
    assert ratio == pytest.approx(2.0, rel=0.1)
    for row in out["validation"]:
        assert abs(row["error_pct"]) < 3.0, row
    text = format_models({"d": fitted})
    assert "x1.50 while sequences generate" in text
    assert "x1.50 beside training" in text


def test_replicas_of_one_task_are_fitted_as_one_profile(tmp_path):
    """A bench of replicas (bench.task m, names m_0..m_3) whose m_0 happened to
    train slower: the fit pools the replicas into one profile (10.5 s), so a
    projection of N replicas costs what the bench's own runs do, not N times
    m_0's outlier."""
    from areal_marlaas.sim.project import simulate_bench

    def truth(mode):
        m = _truth()
        m.train_by_task = {"m_0": 15.0}
        return m

    plan = [(mode, mode, 4) for mode in ("async", "sync", "sequential")]
    write_bench(tmp_path, truth, plan, bench={"task": "m", "replicas": 4})
    out = simulate_bench(tmp_path, [4], fit_modes=["async"])
    fitted = LatencyModels.from_dict(out["models"]["disaggregated"])
    assert fitted.train_by_task == pytest.approx({"m": 10.5})
    measured = next(r for r in out["validation"] if r["label"] == "sequential")
    projected = next(
        r for r in out["projection"] if (r["tenants"], r["mode"]) == (4, "sequential")
    )
    assert projected["wall_s"] == pytest.approx(measured["simulated_wall_s"])
    assert projected["wall_s"] == pytest.approx(measured["measured_wall_s"], rel=0.02)


@pytest.mark.parametrize("other_train_s", [9.0, 14.0])
def test_another_benchs_tenant_count_is_predicted_out_of_sample(
    tmp_path, other_train_s
):
    """Fitted on one bench (1-4 tenants, 2 steps), it predicts another bench's
    8-tenant 3-step runs it never saw: right when the truth is the same, off
    when the other bench's train steps cost more. Elastic runs (borrowed
    cores, which the train model does not cover) are left out."""
    from areal_marlaas.sim.project import format_sim_markdown, simulate_bench

    fit, other = tmp_path / "fit", tmp_path / "eight"
    write_bench(fit, lambda mode: _truth(9.0))
    plan = [("async", "async", 8), ("sync", "sync", 8), ("async_elastic", "async", 8)]
    write_bench(
        other,
        lambda mode: _truth(other_train_s),
        plan,
        steps=3,
        overrides={"async_elastic": {"scheduler.elastic_cpus": "'0'"}},
    )
    out = simulate_bench(fit, [1], predict=[other])
    rows = {r["label"]: r for r in out["validation"]}
    assert {"eight:async", "eight:sync"} <= set(rows)
    assert "eight:async_elastic" not in rows
    assert not rows["eight:async"]["in_sample"] and rows["async"]["in_sample"]
    assert rows["eight:async"]["tenants"] == 8
    for k in ("eight:async", "eight:sync"):
        if other_train_s == 9.0:
            assert abs(rows[k]["error_pct"]) < 2.0, rows[k]
        else:
            assert rows[k]["error_pct"] < -20, rows[k]
    assert "runs of" in format_sim_markdown(out)


def test_cli_projects_the_mix_over_a_sweep_of_tool_call_times(tmp_path, capsys):
    """`marlaas simulate --mix --env-s 0,30`: tenants replicate the bench's whole
    mix with each template's own latencies, and every batch's tool calls add
    the swept time: sequential, 4 tenants x 2 steps, is 8 x 30 s longer."""
    from areal_marlaas.cli import main

    def truth(mode):
        m = _truth()
        m.train_by_task = {"m_1": 15.0}
        return m

    write_bench(tmp_path, truth)
    argv = ["simulate", str(tmp_path), "--fit-modes", "async", "--tenants", "4"]
    argv += ["--out", str(tmp_path / "sim.json")]
    assert main([*argv, "--mix", "--env-s", "0,30"]) == 0
    out = json.loads((tmp_path / "sim.json").read_text())
    assert out["replicates"] == ["m_0", "m_1", "m_2", "m_3"]
    wall = {(r["mode"], r["env_s"]): r for r in out["projection"]}
    assert set(wall) == {(m, e) for m in MODES for e in (0.0, 30.0)}
    seq0, seq30 = wall[("sequential", 0.0)], wall[("sequential", 30.0)]
    assert seq30["wall_s"] - seq0["wall_s"] == pytest.approx(8 * 30.0, abs=0.1)
    assert seq0["vs_sequential"] == 1.0
    assert (
        wall[("async", 30.0)]["vs_sequential"] > wall[("async", 0.0)]["vs_sequential"]
    )
    assert "| 4 | sequential | 30 |" in (tmp_path / "sim.md").read_text()
    # t1 replicates m_1 (15 s steps): the mix is longer than 4 copies of m_0.
    assert main([*argv, "--env-s", "0"]) == 0
    first = json.loads((tmp_path / "sim.json").read_text())
    assert first["replicates"] == ["m_0"]
    seq_first = next(r for r in first["projection"] if r["mode"] == "sequential")
    assert seq0["wall_s"] - seq_first["wall_s"] == pytest.approx(2 * 6.0, abs=0.5)
    capsys.readouterr()
    assert main([*argv, "--env-s", "ten"]) == 2
    assert "--env-s: expected seconds" in capsys.readouterr().err


def test_the_fit_input_fits_what_the_raw_runs_fit(tmp_path):
    """A result folder without its raw runs fits, checks and projects from its
    fit_input.json exactly as from the runs it was written from, and the file
    keeps only what the fit reads."""
    import shutil

    from areal_marlaas.sim.fit_input import FIT_INPUT, write_fit_input
    from areal_marlaas.sim.project import simulate_bench

    root = tmp_path / "bench"
    root.mkdir()
    write_bench(root, lambda mode: _truth())
    run = root / "runs" / "async"
    # Records the fit skips, and a task whose batches came back short.
    events = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    events.insert(1, {"task": "m_0", "version": 0, "admission": "admit", "t": 0.0})
    wait = {"task": "m_1", "version": 0, "phase": "wait", "start": 0, "end": 1}
    events.insert(3, wait)
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    steps = [json.loads(x) for x in (run / "steps.jsonl").read_text().splitlines()]
    for s in steps:
        if s["task"] == "m_0":
            s["n_trajectories"] = 9
    (run / "steps.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))

    for fit_modes in (None, ["async"]):
        raw = simulate_bench(root, [1, 4], fit_modes=fit_modes)
        write_fit_input(json.loads((root / "bench.json").read_text()), root)
        shutil.move(root / "runs", tmp_path / "raw_runs")
        try:
            assert simulate_bench(root, [1, 4], fit_modes=fit_modes) == raw
        finally:
            shutil.move(tmp_path / "raw_runs", root / "runs")
    data = json.loads((root / FIT_INPUT).read_text())
    assert set(data["runs"]) == {label for label, _, _ in RUNS}
    kept = {e[0] for r in data["runs"].values() for e in r["events"]}
    assert kept == {"rollout", "train", "publish"}
    assert data["runs"]["async"]["seqs"] == {"m_0": 9, "m_1": 16, "m_2": 16, "m_3": 16}
