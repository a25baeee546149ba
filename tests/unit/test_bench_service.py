"""marlaas bench-service's pure parts: Poisson arrivals, percentiles, the load
metrics of a run, the summary's async / fifo ratios, and config refusals."""

from __future__ import annotations

import statistics
from itertools import pairwise

import numpy as np
import pytest

from areal_marlaas.bench.run_metrics import percentile
from areal_marlaas.bench.service_bench import format_markdown, summarize
from areal_marlaas.bench.service_load import (
    arrival_times,
    job_plan,
    run_metrics,
    tenant_metrics,
)
from areal_marlaas.config.bench_service import ServiceLoadConfig
from areal_marlaas.errors import ConfigError


def test_arrivals_are_poisson_and_shared_across_rates():
    t = arrival_times(20000, rate_per_min=6.0, seed=3)
    assert t[0] == 0.0 and all(b > a for a, b in pairwise(t))
    gaps = [b - a for a, b in pairwise(t)]
    # Exponential gaps: mean = sd = 60 / rate.
    assert statistics.fmean(gaps) == pytest.approx(10.0, rel=0.03)
    assert statistics.stdev(gaps) == pytest.approx(10.0, rel=0.05)
    # Same seed, another rate: the same draws scaled; another seed: others.
    t2 = arrival_times(8, rate_per_min=12.0, seed=3)
    assert t2 == pytest.approx([x / 2 for x in t[:8]])
    assert arrival_times(8, 6.0, seed=4) != t[:8]


def test_percentile_is_numpys_linear_percentile():
    rng = np.random.default_rng(0)
    for n in (1, 2, 5, 8, 33):
        xs = list(rng.exponential(10.0, n))
        for q in (0, 50, 95, 100):
            assert percentile(xs, q) == pytest.approx(np.percentile(xs, q))
    assert percentile([], 50) is None


def job(ttfs, commits, train, status="succeeded"):
    return {"status": status, "ttfs_s": ttfs, "commits": commits, "train_s": train}


def test_run_metrics_exact_numbers():
    # Three jobs created at 100, 110, 130 (first arrival 100).
    jobs = [
        job(20.0, [120.0, 150.0], [10.0, 10.0]),
        job(50.0, [160.0, 170.0], [10.0, 10.0]),
        job(60.0, [190.0, 200.0, 220.0], [5.0, 5.0, 10.0], status="failed"),
    ]
    m = run_metrics(jobs, first_arrival=100.0)
    assert m["jobs"] == 3 and m["succeeded"] == 2 and m["steps"] == 7
    assert m["window_s"] == 120.0  # last commit 220 - first arrival 100
    assert m["steps_per_hour"] == pytest.approx(7 / 120 * 3600)
    assert m["ttfs_p50_s"] == 50.0
    assert m["ttfs_p95_s"] == pytest.approx(50 + 0.9 * 10)  # 59.0
    # TPTS: gaps inside each job only: 30, 10, 10, 20.
    assert m["tpts_p50_s"] == 15.0
    assert m["tpts_p95_s"] == pytest.approx(28.5)  # sorted 10 10 20 30
    assert m["step_s"] == pytest.approx(60 / 7)
    assert m["ttfs_p95_in_steps"] == pytest.approx(59.0 / (60 / 7))
    assert m["ttfs_p95_in_tpts"] == pytest.approx(59.0 / 15.0)
    assert m["ttfs_by_arrival"] == [20.0, 50.0, 60.0]
    # Created at 100, 110, 130; done at 150, 170, 220: 50, 60, 90 s.
    assert m["jct_p50_s"] == 60.0
    assert m["jct_p95_s"] == pytest.approx(60 + 0.9 * 30)


def test_ttfs_parts_sum_to_ttfs_and_average_over_jobs_that_have_them():
    from areal_marlaas.bench.service_load import ttfs_parts

    a = {**job(20.0, [120.0], [4.0]), "waiting_s": 2.0, "queue_wait_s": [3.0]}
    b = {**job(30.0, [140.0], [6.0]), "waiting_s": 10.0, "queue_wait_s": [1.0]}
    never = {**job(None, [], [], status="cancelled"), "waiting_s": None}
    parts = ttfs_parts(a)
    assert parts == {
        "waiting_s": 2.0,
        "first_batch_s": 11.0,
        "queue_s": 3.0,
        "train_s": 4.0,
    }
    assert sum(parts.values()) == a["ttfs_s"] and ttfs_parts(never) is None
    m = run_metrics([a, b, never], first_arrival=100.0)
    assert m["ttfs_parts"] == {
        "waiting_s": 6.0,
        "first_batch_s": (11.0 + 13.0) / 2,
        "queue_s": 2.0,
        "train_s": 5.0,
    }
    assert run_metrics([never], first_arrival=0.0)["ttfs_parts"] is None


def run(service, rate, repeat, steps_per_hour, ttfs):
    jobs = [
        {**job(t, [100.0 + t, 110.0 + t], [5.0, 5.0]), "waiting_s": 1.0}
        | {"queue_wait_s": [2.0, 0.0]}
        for t in ttfs
    ]
    m = run_metrics(jobs, first_arrival=100.0)
    m["steps_per_hour"] = steps_per_hour
    return {
        "label": f"{service}@{rate}.r{repeat}",
        "service": service,
        "rate_per_min": rate,
        "repeat": repeat,
        "status": "ok",
        "metrics": m,
    }


def test_summary_means_and_async_over_fifo_ratios():
    result = {
        "runs": [
            run("async", 4.0, 0, 300.0, [10.0, 12.0]),
            run("fifo", 4.0, 0, 200.0, [10.0, 40.0]),
            run("async", 4.0, 1, 340.0, [10.0, 14.0]),
            run("fifo", 4.0, 1, 200.0, [10.0, 60.0]),
            run("async_first", 4.0, 0, 250.0, [10.0, 11.0]),
            {"label": "fifo@4.r2", "service": "fifo", "rate_per_min": 4.0},
        ]
    }
    result["runs"][-1]["status"] = "failed"
    rows = {r["service"]: r for r in summarize(result)}
    a, f = rows["async"], rows["fifo"]
    assert (a["repeats"], f["repeats"], f["failed"]) == (2, 2, 1)
    assert a["steps_per_hour"][0] == 320.0
    assert a["steps_per_hour"][1] == pytest.approx(statistics.stdev([300, 340]))
    assert a["throughput_vs_fifo"] == pytest.approx(1.6)
    ttfs_a = statistics.fmean([10 + 0.95 * 2, 10 + 0.95 * 4])
    ttfs_f = statistics.fmean([10 + 0.95 * 30, 10 + 0.95 * 50])
    assert a["ttfs_p95_vs_fifo"] == pytest.approx(ttfs_a / ttfs_f)
    assert rows["async_first"]["throughput_vs_fifo"] == pytest.approx(1.25)
    assert "throughput_vs_fifo" not in f
    md = format_markdown({**result, "summary": summarize(result)})
    assert "| fifo | 4 | 2 (1 failed) |" in md and "1.60x" in md
    # TTFS parts: async's first batches took ttfs - 1 - 2 - 5: (2 + 4) / 2 in
    # repeat 0, (2 + 6) / 2 in repeat 1.
    parts = a["ttfs_parts"]
    assert parts["waiting_s"] == (1.0, 0.0) and parts["train_s"][0] == 5.0
    assert parts["first_batch_s"][0] == pytest.approx(3.5)
    assert "| async | 4 | 1.0 +- 0.0 | 3.5 +- 0.7 | 2.0 +- 0.0 | 5.0 +- 0.0 |" in md


@pytest.mark.parametrize(
    "kw, field",
    [
        ({"services": ["lifo"]}, "load.services"),
        ({"rates_per_min": [0.0]}, "load.rates_per_min"),
        ({"rates_per_min": []}, "load.rates_per_min"),
        ({"jobs": 0}, "load.jobs"),
        ({"lines_per_job": 1, "batch_size": 2}, "load.lines_per_job"),
        ({"grader": "python"}, "load.grader"),
        ({"repeats": 0}, "load.repeats"),
        ({"tenants": [{"name": "a", "weight": 0}]}, r"load.tenants\[a\].weight"),
        ({"tenants": [{"name": "a", "jobs": 0}]}, r"load.tenants\[a\].jobs"),
        ({"tenants": [{"weight": 1}]}, "load.tenants"),
        ({"tenants": [{"name": "a"}, {"name": "a"}]}, "load.tenants"),
    ],
)
def test_bad_load_settings_are_refused_naming_the_field(kw, field):
    pattern = field if "\\" in field else field.replace(".", r"\.")
    with pytest.raises(ConfigError, match=pattern):
        ServiceLoadConfig(**kw)


def test_shipped_config_loads_and_sets_the_services_apart():
    from omegaconf import OmegaConf

    from areal_marlaas.bench.service_bench import ServiceBench, load_service_bench
    from tests.support.paths import REPO

    cfg, base, overrides = load_service_bench(
        [
            "--config",
            str(REPO / "configs" / "bench_service.yaml"),
            "load.jobs=3",
            "service.max_new_tokens=16",
        ]
    )
    assert cfg.load.jobs == 3 and cfg.load.rates_per_min == [2.0, 6.0]
    raw = OmegaConf.load(base)
    # The service's own YAML: the shipped service config, without `load`.
    assert "load" not in raw and raw.service.max_new_tokens == 32
    assert overrides == ["service.max_new_tokens=16"]
    bench = ServiceBench(cfg, base, overrides)
    fifo, par = bench._service_overrides("fifo"), bench._service_overrides("async")
    first = bench._service_overrides("async_first")
    assert "service.max_running_jobs=1" in fifo
    assert "service.max_running_jobs=3" in par and "service.max_running_jobs=3" in first
    assert fifo[0] == par[0] == first[0] == "service.max_new_tokens=16"
    # Each sets its training order, whatever the service YAML's default.
    assert "scheduler.train_order=fifo" in par and "scheduler.train_order=fifo" in fifo
    assert "scheduler.train_order=first_steps" in first
    from areal_marlaas.service.cli import load_service_config

    assert load_service_config(base, first).scheduler.train_order == "first_steps"


def tenants_load(**kw) -> ServiceLoadConfig:
    return ServiceLoadConfig(
        tenants=[
            {"name": "heavy", "jobs": 1, "batch_size": 4, "compute_multiplier": 2.0},
            {"name": "light", "jobs": 3, "weight": 2.0},
        ],
        **kw,
    )


def test_job_plan_mixes_tenants_by_seed_and_keeps_every_job_s_step_count():
    load = tenants_load(lines_per_job=4, batch_size=2)
    plan = job_plan(load, seed=0)
    assert sorted(p.tenant for p in plan) == ["heavy", "light", "light", "light"]
    heavy = next(p for p in plan if p.tenant == "heavy")
    light = next(p for p in plan if p.tenant == "light")
    # Two batches each: the heavy job's lines scale with its batch size.
    assert (heavy.batch_size, heavy.lines, heavy.compute_multiplier) == (4, 8, 2.0)
    assert (light.batch_size, light.lines, light.weight) == (2, 4, 2.0)
    assert job_plan(load, seed=0) == plan  # every service sees the same order
    orders = {tuple(p.tenant for p in job_plan(load, s)) for s in range(20)}
    assert len(orders) == 4  # the heavy job's place moves with the seed
    single = job_plan(ServiceLoadConfig(jobs=3), seed=0)
    assert [p.tenant for p in single] == ["bench"] * 3


def test_tenant_metrics_exact_shares_and_fairness():
    jobs = [
        {
            "tenant": "a",
            "task": "ta",
            "ttfs_s": 10.0,
            "train_s": [4.0, 4.0],
            "usage": {"trainer_s": 8.0, "generated_tokens": 300},
        },
        {
            "tenant": "b",
            "task": "tb",
            "ttfs_s": 6.0,
            "train_s": [2.0, 2.0],
            "usage": {"trainer_s": 4.0, "generated_tokens": 100},
        },
    ]
    # Both backlogged in [0, 10]: a trains 0-4, b 4-6 (weight 2), a 6-10.
    events = [
        {"task": "ta", "phase": "queue", "start": 0.0, "end": 0.0},
        {"task": "ta", "phase": "train", "start": 0.0, "end": 4.0},
        {"task": "tb", "phase": "queue", "start": 0.0, "end": 4.0},
        {"task": "tb", "phase": "train", "start": 4.0, "end": 6.0},
        {"task": "ta", "phase": "queue", "start": 4.0, "end": 6.0},
        {"task": "ta", "phase": "train", "start": 6.0, "end": 10.0},
        {"task": "tb", "phase": "queue", "start": 6.0, "end": 10.0},
        {"task": "other", "phase": "train", "start": 0.0, "end": 10.0},
    ]
    m = tenant_metrics(jobs, events, {"a": 1.0, "b": 2.0})
    a, b = m["tenants"]["a"], m["tenants"]["b"]
    assert a["weighted_trainer_share"] == pytest.approx(8 / 10)
    assert b["weighted_trainer_share"] == pytest.approx(2 / 10)
    assert (a["token_share"], b["token_share"]) == (0.75, 0.25)
    assert a["ttfs_p95_in_steps"] == pytest.approx(10 / 4)
    assert b["ttfs_p95_in_steps"] == pytest.approx(6 / 2)
    f = m["fairness"]
    assert f["window_s"] == 10.0
    assert f["weighted_trainer_s"] == {"a": 8.0, "b": 1.0}
    assert f["max_min_ratio"] == 8.0
    assert f["jain"] == pytest.approx(81 / (2 * 65))


def test_summary_and_markdown_carry_each_tenant_and_the_fairness():
    def shared(service, repeat, share_a, jain):
        m = {
            "tenants": {
                t: {
                    "ttfs_p95_s": 10.0,
                    "ttfs_p95_in_steps": 2.0,
                    "step_s": 5.0,
                    "weighted_trainer_share": s,
                    "token_share": s,
                }
                for t, s in (("a", share_a), ("b", 1 - share_a))
            },
            "fairness": {"jain": jain, "max_min_ratio": 2.0, "window_s": 30.0},
        }
        r = run(service, 4.0, repeat, 300.0, [10.0, 12.0])
        r["metrics"].update(m)
        return r

    result = {
        "runs": [
            shared("async", 0, 0.8, 0.7),
            shared("async", 1, 0.6, 0.9),
            shared("fair", 0, 0.5, 1.0),
        ]
    }
    rows = {r["service"]: r for r in summarize(result)}
    a = rows["async"]
    assert a["tenants"]["a"]["weighted_trainer_share"][0] == pytest.approx(0.7)
    assert a["fairness"]["jain"][0] == pytest.approx(0.8)
    md = format_markdown({**result, "summary": summarize(result)})
    assert "| fair | 4 | a | 10.0 | 2.00 | 5.0 | 0.50 | 0.50 |" in md
    assert "| async | 4 | 0.800 +- 0.141 | 2.00 +- 0.00 | 30.0 +- 0.0 |" in md


def test_shipped_tenants_config_sets_fair_shares_and_per_tenant_caps():
    from areal_marlaas.bench.service_bench import ServiceBench, load_service_bench
    from areal_marlaas.service.cli import load_service_config
    from tests.support.paths import REPO

    cfg, base, overrides = load_service_bench(
        ["--config", str(REPO / "configs" / "bench_service_tenants.yaml")]
    )
    assert [t.name for t in cfg.load.tenants][0] == "heavy"
    bench = ServiceBench(cfg, base, overrides)
    fair = bench._service_overrides("fair")
    assert "scheduler.train_order=fair" in fair
    assert "scheduler.rollout_order=fair" in fair
    assert "service.max_running_jobs=2" in fair  # each tenant runs all its jobs
    service = load_service_config(base, fair)
    assert service.vllm.scheduling_policy == "priority"
    asynchronous = bench._service_overrides("async")
    assert "scheduler.rollout_order=fifo" in asynchronous
    # FIFO over several tenants: the scheduler holds one job at a time.
    assert "service.max_tasks=1" in bench._service_overrides("fifo")
    assert bench._weights() == {
        "heavy": 1.0,
        "light-a": 1.0,
        "light-b": 1.0,
        "light-c": 2.0,
    }
    adaptive = bench._service_overrides("fair_adaptive")
    assert "scheduler.concurrency=adaptive" in adaptive
    assert "scheduler.train_order=fair" in adaptive
    assert "scheduler.concurrency=off" in fair
    assert load_service_config(base, adaptive).scheduler.concurrency == "adaptive"


def test_shipped_weights_config_runs_two_weighted_tenants_under_fair():
    from areal_marlaas.bench.service_bench import ServiceBench, load_service_bench
    from tests.support.paths import REPO

    cfg, base, overrides = load_service_bench(
        ["--config", str(REPO / "configs" / "bench_service_weights.yaml")]
    )
    bench = ServiceBench(cfg, base, overrides)
    assert cfg.load.services == ["fair"]
    assert bench._weights() == {"w1": 1.0, "w2": 2.0}
    assert "scheduler.train_order=fair" in bench._service_overrides("fair")


def test_shipped_agents_config_sends_agent_jobs_to_a_slow_search_tool(tmp_path):
    """Agentic tenants' jobs carry the search tool of a real search server
    started at their latency; their rows are lookup rows, no two jobs the same;
    the service lets tools reach loopback."""
    import json

    import httpx

    from areal_marlaas.bench.service_agents import ToolServers
    from areal_marlaas.bench.service_bench import ServiceBench, load_service_bench
    from areal_marlaas.service.cli import load_service_config
    from tests.support.paths import REPO

    cfg, base, overrides = load_service_bench(
        ["--config", str(REPO / "configs" / "bench_service_agents.yaml")]
    )
    bench = ServiceBench(cfg, base, overrides)
    plan = job_plan(cfg.load, cfg.load.seed)
    agents = [j for j in plan if j.tool_latency_s]
    assert sorted({j.tool_latency_s for j in agents}) == [1.0, 4.0]
    fifo = bench._service_overrides("fifo")
    assert load_service_config(base, fifo).service.egress.allow == ["127.0.0.0/8"]
    lat = [j.tool_latency_s for j in plan]
    with ToolServers(tmp_path, lat, 8, 0) as tools:
        bench.tools = tools
        job = agents[0]
        method = bench._method(job)["reinforcement"]
        (tool,) = method["tools"]
        assert method["max_episode_steps"] == 3
        assert tool["server_url"] == f"{tools.urls[job.tool_latency_s]}/tools/search"
        first = [json.loads(x) for x in bench._lines(job, 0).splitlines()]
        second = [json.loads(x) for x in bench._lines(job, 1).splitlines()]
        assert len(first) == job.lines and first[0]["tools"][0]["function"]["name"]
        assert not {r["answer"] + r["messages"][-1]["content"] for r in first} & {
            r["answer"] + r["messages"][-1]["content"] for r in second
        }
        # The tool answers the row's question with its code (after its wait).
        key = first[0]["messages"][-1]["content"].split()[-1].rstrip("?")
        reply = httpx.post(
            tool["server_url"],
            json={
                "type": "function_call",
                "call_id": "c",
                "name": "search",
                "arguments": json.dumps({"query": key}),
            },
            timeout=60,
        ).json()
        code = first[0]["answer"].split()[-1].rstrip(".")
        assert f"code {code}" in reply["output"].splitlines()[0]
    single = [j for j in plan if not j.tool_latency_s][0]
    assert "tools" not in bench._method(single)["reinforcement"]


def test_a_negative_tool_latency_is_refused():
    with pytest.raises(ConfigError, match="tool_latency_s"):
        ServiceLoadConfig(tenants=[{"name": "a", "tool_latency_s": -1.0}])


def test_the_tool_table_shows_hidden_tool_time_per_service():
    a0, a1 = run("async", 8.0, 0, 300.0, [10.0]), run("async", 8.0, 1, 300.0, [10.0])
    f0 = run("fifo", 8.0, 0, 200.0, [10.0])
    for r, (tool, hidden, busy) in zip(
        (a0, a1, f0),
        ((40.0, 0.5, 0.6), (60.0, 0.7, 0.8), (50.0, 0.0, 0.3)),
        strict=True,
    ):
        r["metrics"].update(
            tool_s=tool,
            tool_hidden_share=hidden,
            tool_behind_training_share=hidden / 2,
            train_busy_share=busy,
        )
    result = {"runs": [a0, a1, f0]}
    md = format_markdown({**result, "summary": summarize(result)})
    assert (
        "| async | 8 | 50.0 +- 14.1 | 0.60 +- 0.14 | 0.30 +- 0.07 | 0.70 +- 0.14 |"
        in md
    )
    assert "| fifo | 8 | 50.0 | 0.00 | 0.00 | 0.30 |" in md
    # Runs without agents print no tool table.
    plain = {"runs": [run("async", 8.0, 0, 300.0, [10.0])]}
    assert "hidden" not in format_markdown({**plain, "summary": summarize(plain)})
