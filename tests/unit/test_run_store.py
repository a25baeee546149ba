"""The run directory: atomic commits, fresh starts, adapter pruning."""

from __future__ import annotations

import pytest

from areal_marlaas.rundir.reader import read_jsonl
from areal_marlaas.rundir.writer import RunStore
from areal_marlaas.tasks.prompt_order import TaskData


def fake_adapter(store: RunStore, task: str, version: int) -> None:
    d = store.adapter_dir(task, version)
    d.mkdir(parents=True)
    (d / "adapter_model.safetensors").write_bytes(b"x")


def test_commit_requires_a_complete_adapter_and_records_it(tmp_path):
    store = RunStore(tmp_path)
    with pytest.raises(RuntimeError, match="incomplete"):
        store.commit("a", 1, {"cursor": 4})
    assert store.committed("a") is None

    fake_adapter(store, "a", 1)
    store.commit("a", 1, {"cursor": 4})

    state = store.committed("a")
    assert state["version"] == 1 and state["cursor"] == 4
    assert not list(store.task_dir("a").glob(".*.tmp"))  # no half-written file


def test_fresh_store_removes_an_earlier_runs_logs(tmp_path):
    old = RunStore(tmp_path)
    old.step({"task": "a", "version": 1})
    old.event("a", 0, "rollout", 0.0, 1.0)
    fake_adapter(old, "a", 0)

    new = RunStore(tmp_path)

    assert read_jsonl(new.steps_path) == [] and read_jsonl(new.events_path) == []
    assert not new.adapter_dir("a", 0).exists()
    kept = RunStore(tmp_path, fresh=False)
    kept.step({"task": "a", "version": 1})
    assert len(read_jsonl(RunStore(tmp_path, fresh=False).steps_path)) == 1


def test_prune_keeps_only_named_versions(tmp_path):
    store = RunStore(tmp_path)
    for v in range(4):
        fake_adapter(store, "a", v)

    store.prune_adapters("a", keep={2, 3})

    assert sorted(p.name for p in (store.task_dir("a") / "adapters").iterdir()) == [
        "v2",
        "v3",
    ]


def test_task_data_cursor_resumes_the_same_order():
    rows = [{"id": i, "messages": []} for i in range(10)]
    a = TaskData(rows, seed=3)
    first = [r["id"] for r in a.next_batch(4)]
    rest = [r["id"] for r in a.next_batch(8)]  # crosses into the next epoch

    b = TaskData(rows, seed=3, cursor=4)

    assert [r["id"] for r in b.next_batch(8)] == rest
    assert sorted(first + rest[:6]) == list(range(10))  # one epoch = each row once


def test_phase_report_aggregates_events_per_task(tmp_path):
    from areal_marlaas.rundir.phases import format_phase_stats, phase_stats

    store = RunStore(tmp_path)
    store.event("a", 0, "rollout", 0.0, 2.0)
    store.event("a", 1, "rollout", 10.0, 14.0)
    store.event("b", 0, "train", 2.0, 5.0)

    stats = phase_stats(tmp_path)

    assert stats["a"]["rollout"] == {"n": 2, "mean_s": 3.0, "p50_s": 3.0, "max_s": 4.0}
    assert stats["all"]["train"]["n"] == 1
    assert "a            rollout     2     3.00" in format_phase_stats(stats)
