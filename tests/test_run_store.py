"""The run directory: atomic commits, fresh starts, adapter pruning."""

from __future__ import annotations

import pytest

from areal_marlaas.manager.data import TaskData
from areal_marlaas.manager.store import RunStore, read_jsonl


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
