"""Every execution mode end to end: 2 tasks x 2 steps through the real vLLM server
and the real FSDP engine, checked from the run directory's own timestamps."""

from __future__ import annotations

import json

import pytest

from areal_marlaas.config import load_config
from areal_marlaas.rundir.reader import read_jsonl
from areal_marlaas.train.trainer import MultiTaskTrainer
from tests.support.paths import REPO

pytestmark = pytest.mark.vllm

TASKS = ("add2", "mul1")


TASKS_YAML = """
tasks:
  - {name: add2, kind: addition, dataset: {digits: 2, size: 200}, seed: 1}
  - {name: mul1, kind: multiplication, dataset: {digits: 1, size: 200}, seed: 2}
"""
SMALL = dict(total_steps=2, batch_size=2, n_samples=2, max_new_tokens=24)


def run_mode(tmp_path, address: str, trial: str, *extra: str):
    """Two arithmetic tasks, 2 steps of 2 prompts x 2 samples, in-process engines."""
    tasks = tmp_path / "tasks.yaml"
    tasks.write_text(TASKS_YAML)
    overrides = [
        f"cluster.fileroot={tmp_path}",
        f"trial_name={trial}",
        f'server.addresses=["{address}"]',
        "scheduler.type=null",
    ]
    for i in range(2):
        overrides += [f"tasks.{i}.{k}={v}" for k, v in SMALL.items()]
    cfg, _ = load_config(
        [
            "--config",
            str(REPO / "configs" / "quickstart.yaml"),
            "--tasks",
            str(tasks),
            *overrides,
            *extra,
        ]
    )
    summary = MultiTaskTrainer(cfg).run()
    run = tmp_path / "marlaas-quickstart" / trial
    events = read_jsonl(run / "events.jsonl")
    intervals = [e for e in events if "phase" in e]
    admission = [e for e in events if "admission" in e]
    steps = read_jsonl(run / "steps.jsonl")
    # Whatever the mode: every task committed 1 and 2 on-policy, and the summary
    # the benchmarks read is there.
    for task in TASKS:
        assert [s["version"] for s in steps if s["task"] == task] == [1, 2]
    assert all(s["staleness_max"] == 0 for s in steps)
    saved = json.loads((run / "summary.json").read_text())
    assert saved["mode"] == cfg.scheduler.mode
    assert all(t["status"] == "done" for t in saved["tasks"].values())
    return summary, intervals, admission


def phase(intervals, name, task=None, version=None):
    return [
        e
        for e in intervals
        if e["phase"] == name
        and (task is None or e["task"] == task)
        and (version is None or e["version"] == version)
    ]


def overlaps(a: dict, b: dict) -> bool:
    return a["start"] < b["end"] and b["start"] < a["end"]


def cross_task_overlaps(xs: list[dict], ys: list[dict]) -> bool:
    return any(overlaps(x, y) for x in xs for y in ys if x["task"] != y["task"])


def test_async_with_budget_for_one_batch_holds_the_second_task(tmp_path, vllm_server):
    from areal_marlaas.admission import KVModel, task_kv_bytes

    # A budget of 1.5 batches: one task rolls out at a time.
    cfg, _ = load_config(["--config", str(REPO / "configs" / "quickstart.yaml")])
    one = task_kv_bytes(KVModel.for_config(cfg), 256, 24, 2, 2)
    budget = int(one * 1.5)

    summary, intervals, admission = run_mode(
        tmp_path, vllm_server.address, "async", f"scheduler.kv_budget_bytes={budget}"
    )

    assert summary["kv_budget"] == budget and summary["admission_holds"] >= 1
    assert any(a["admission"] == "hold" and a["reason"] == "kv" for a in admission)
    for a in admission:
        if a["admission"] == "admit":  # kv_in_use counts the admitted batch too
            assert a["kv_bytes"] <= a["kv_in_use"] <= budget
    rollouts = phase(intervals, "rollout")
    assert not cross_task_overlaps(rollouts, rollouts)
    # Asynchrony survives admission: a task trains while the other rolls out.
    assert cross_task_overlaps(rollouts, phase(intervals, "train"))


def test_sync_barriers_hold_and_live_kv_reaches_admission(tmp_path, vllm_server):
    summary, intervals, admission = run_mode(
        tmp_path,
        vllm_server.address,
        "sync",
        "scheduler.mode=sync",
        "scheduler.kv_live=true",
        "scheduler.kv_poll_interval_s=0.05",  # several reads per rollout
    )

    for v in (0, 1):
        rollouts = phase(intervals, "rollout", version=v)
        trains = phase(intervals, "train", version=v)
        assert len(rollouts) == len(trains) == 2
        # Training of round v starts after the round's last rollout ...
        assert max(r["end"] for r in rollouts) <= min(t["start"] for t in trains)
        # ... and round v+1 starts after every task published v+1.
        publishes = phase(intervals, "publish", version=v + 1)
        following = phase(intervals, "rollout", version=v + 1)
        for r in following:
            assert max(p["end"] for p in publishes) <= r["start"]
    # The server's own KV usage was read while rollouts ran.
    assert summary["kv_peak_reported"] > 0


def test_single_task_modes_never_overlap_tasks(tmp_path, vllm_server):
    # sequential and collocated differ only in placement (scheduler/core.py),
    # which an in-process run on an attached server does not have: one run
    # shows both; the core's property test covers each mode's decisions.
    _, intervals, _ = run_mode(
        tmp_path, vllm_server.address, "sequential", "scheduler.mode=sequential"
    )

    work = [e for e in intervals if e["phase"] in ("rollout", "train", "publish")]
    assert not cross_task_overlaps(work, work)
    # add2 (submitted first) runs all its steps before mul1 starts.
    add2_end = max(e["end"] for e in work if e["task"] == "add2")
    assert all(e["start"] >= add2_end for e in work if e["task"] == "mul1")


def test_multi_lora_off_rolls_out_one_task_at_a_time(tmp_path, vllm_server):
    summary, intervals, admission = run_mode(
        tmp_path, vllm_server.address, "nolora", "scheduler.multi_lora=false"
    )

    rollouts = phase(intervals, "rollout")
    assert not cross_task_overlaps(rollouts, rollouts)
    assert summary["max_rolling"] == 1
    assert any(a["admission"] == "hold" and a["reason"] == "cap" for a in admission)
