"""Multi-LoRA rollout against the real vLLM server (CPU): per-task versioned adapters,
mixed batches, adapter-specific outputs, and publishing without pausing others."""

from __future__ import annotations

import threading
import time

import pytest
import requests

from areal_marlaas.rollout.server_metrics import scrape
from areal_marlaas.tasks.arithmetic import make_arithmetic_rows
from tests.support.leases import LeaseLog
from tests.support.rollouts import rollout, run_concurrently, served_models
from tests.support.snapshots import ok, trajectory_summary

pytestmark = pytest.mark.vllm


def test_register_three_tasks_serves_each_as_task_v0(
    engine, vllm_server, distinct_adapters
):
    for task, path in zip(("r_a", "r_b", "r_c"), distinct_adapters, strict=False):
        engine.register_task(task, 0, path)

    models = served_models(vllm_server.address)

    assert {"r_a-v0", "r_b-v0", "r_c-v0"} <= models
    assert {t: v for t, (v, _) in engine.served().items()} == {
        "r_a": 0,
        "r_b": 0,
        "r_c": 0,
    }


def test_greedy_same_prompt_yields_adapter_specific_outputs(
    engine, model_path, distinct_adapters
):
    tasks = ("g_a", "g_b", "g_c")
    for task, path in zip(tasks, distinct_adapters, strict=False):
        engine.register_task(task, 0, path)
    rows = make_arithmetic_rows("addition", 1, 2, seed=7)

    def outputs():
        got = {}
        for task in tasks:
            (traj,) = rollout(engine, task, rows, model_path, group_size=1, greedy=True)
            got[task] = tuple(trajectory_summary(traj)["samples"][0]["output_ids"])
        return got

    first, second = outputs(), outputs()

    # Greedy decoding is deterministic per adapter...
    assert first == second
    # ...and the same prompt gives a different continuation under each adapter.
    assert len(set(first.values())) == 3


def test_mixed_batch_of_three_tasks_is_served_together(
    engine, vllm_server, model_path, distinct_adapters
):
    tasks = ("m_a", "m_b", "m_c")
    for task, path in zip(tasks, distinct_adapters, strict=False):
        engine.register_task(task, 0, path)
    rows = make_arithmetic_rows("multiplication", 6, 1, seed=3)
    # Every sequence runs its 24 tokens: the three rollouts overlap for seconds,
    # their threads start ms apart.
    gen = dict(temperature=1.0, min_new_tokens=24, ignore_eos=True)

    results = run_concurrently(
        {t: (lambda t=t: rollout(engine, t, rows, model_path, **gen)) for t in tasks}
    )

    # The server ran requests of all three adapters in one batch at some point
    # (vLLM keeps a sample for every set of adapters it ran together).
    running_sets = scrape(vllm_server.address).running_adapter_sets
    assert any({"m_a-v0", "m_b-v0", "m_c-v0"} <= s for s in running_sets)
    for task in tasks:
        trajs = results[task]
        assert len(trajs) == len(rows) and all(ok(t) for t in trajs)
        for traj in trajs:
            summary = trajectory_summary(traj)
            assert summary["task"] == task
            assert len(summary["samples"]) == 2  # the GRPO group
            for s in summary["samples"]:
                assert s["versions"] == [0]
                assert 0 < len(s["output_ids"]) <= 24
                assert len(s["logprobs"]) == len(s["output_ids"])
                assert all(lp <= 0.0 for lp in s["logprobs"])
                assert s["reward"] in (0.0, 1.0)


def test_publish_new_version_while_other_tasks_generate_fails_nothing(
    engine, vllm_server, model_path, distinct_adapters
):
    a0, a1, a2, a3 = distinct_adapters
    for task, path in (("p_a", a0), ("p_b", a1), ("p_c", a2)):
        engine.register_task(task, 0, path)
    rows = make_arithmetic_rows("addition", 6, 2, seed=5)
    # Every request runs its 64 tokens (64 decode steps, seconds here): those in
    # flight when the publish starts are still in flight when it is done.
    gen = dict(max_new_tokens=64, min_new_tokens=64, ignore_eos=True)
    engine.adapters.listener = log = LeaseLog()
    out: dict = {}

    def others():
        out.update(
            run_concurrently(
                {
                    t: (lambda t=t: rollout(engine, t, rows, model_path, **gen))
                    for t in ("p_b", "p_c")
                }
            )
        )

    def a_first_batch():
        out["p_a_v0"] = rollout(engine, "p_a", rows[:3], model_path, **gen)

    background = [
        threading.Thread(target=others),
        threading.Thread(target=a_first_batch),
    ]
    for t in background:
        t.start()
    deadline = time.monotonic() + 60
    # Publish once all of p_a's first batch (3 prompts x 2) and some of the other
    # tasks' requests are in flight.
    while not (
        log.inflight("p_a-v0") == 6
        and log.inflight("p_b-v0")
        and log.inflight("p_c-v0")
    ):
        assert time.monotonic() < deadline, "rollouts never got in flight"
        time.sleep(0.05)

    retired = engine.publish("p_a", 1, a3)
    t_publish = log.published_at["p_a-v1"]
    # p_a's next batch starts right away, on the new adapter.
    out["p_a_v1"] = rollout(engine, "p_a", rows[3:], model_path, **gen)
    for t in background:
        t.join()
    assert retired.result(timeout=120) == "p_a-v0"

    # No request failed anywhere, and every token came from the version it was
    # pinned to.
    for key, want in (("p_b", 0), ("p_c", 0), ("p_a_v0", 0), ("p_a_v1", 1)):
        assert all(ok(t) for t in out[key]), key
        for traj in out[key]:
            for s in trajectory_summary(traj)["samples"]:
                assert s["versions"] == [want], key
                assert len(s["output_ids"]) == 64, key
    # The other tasks really were generating while p_a published.
    for name in ("p_b-v0", "p_c-v0", "p_a-v0"):
        assert any(
            n == name and start < t_publish < (end or 0) for n, start, end in log.leases
        ), name
    # p_a-v0 got no new request once v1 was live, and was unloaded only after its
    # last request finished.
    a_v0 = [(start, end) for n, start, end in log.leases if n == "p_a-v0"]
    assert all(start < log.published_at["p_a-v1"] for start, _ in a_v0)
    assert log.retired_at["p_a-v0"] >= max(end for _, end in a_v0)
    models = served_models(vllm_server.address)
    assert "p_a-v0" not in models
    assert {"p_a-v1", "p_b-v0", "p_c-v0"} <= models
    gone = requests.post(
        f"http://{vllm_server.address}/v1/completions",
        json={"model": "p_a-v0", "prompt": [1, 2, 3], "max_tokens": 1},
        timeout=30,
    )
    assert gone.status_code == 404


def test_name_served_from_another_folder_is_replaced(
    engine, vllm_server, distinct_adapters
):
    """An earlier run on a shared server left `x_a-v0`; this run's weights win."""
    engine.register_task("x_a", 0, distinct_adapters[0])
    engine.register_task("x_a", 0, distinct_adapters[0])  # same folder: a no-op

    engine.register_task("x_a", 0, distinct_adapters[1])

    data = requests.get(f"http://{vllm_server.address}/v1/models", timeout=10).json()
    roots = {m["id"]: m["root"] for m in data["data"]}
    assert roots["x_a-v0"] == str(distinct_adapters[1])
