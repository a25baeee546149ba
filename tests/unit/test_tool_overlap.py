"""The tool-time overlap the service bench reports, on hand-made intervals."""

from __future__ import annotations

import pytest

from areal_marlaas.bench.tool_overlap import merged, subtract, tool_overlap


def ph(task: str, phase: str, start: float, end: float) -> dict:
    return {"task": task, "phase": phase, "start": start, "end": end}


def test_merged_and_subtract_are_interval_set_operations():
    assert merged([(5, 6), (0, 2), (1, 3), (3, 4)]) == [(0, 4), (5, 6)]
    assert subtract([(0, 10)], [(2, 3), (5, 12)]) == [(0, 2), (3, 5)]


def test_tool_time_is_hidden_only_by_other_tasks_work():
    phases = [
        # The agent: a rollout of 12 s whose tools took 0-10 s, then its step.
        ph("agent", "rollout", 0, 12),
        ph("agent", "env", 0, 10),
        ph("agent", "train", 12, 14),
        # Another tenant: trains 2-6 s, generates 5-8 s.
        ph("other", "train", 2, 6),
        ph("other", "rollout", 5, 8),
    ]
    m = tool_overlap(phases, (0, 20))
    assert m["tool_s"] == 10
    assert m["tool_hidden_s"] == pytest.approx(6)  # 2-8
    assert m["tool_hidden_share"] == pytest.approx(0.6)
    assert m["tool_behind_training_share"] == pytest.approx(0.4)  # 2-6
    assert m["train_busy_share"] == pytest.approx(6 / 20)  # 2-6 and 12-14


def test_another_agents_tool_wait_hides_nothing():
    phases = [
        ph("a", "rollout", 0, 10),
        ph("a", "env", 0, 10),
        # b's rollout is all tool wait: no work of b's.
        ph("b", "rollout", 0, 10),
        ph("b", "env", 0, 10),
    ]
    m = tool_overlap(phases)
    assert m["tool_s"] == 20 and m["tool_hidden_s"] == 0
    assert "train_busy_share" not in m


def test_no_tools_no_tool_metrics():
    assert tool_overlap([ph("x", "train", 0, 1)]) == {}
