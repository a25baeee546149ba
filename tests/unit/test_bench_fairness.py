"""Fairness of a run's trainer time between tenants, from interval events."""

from __future__ import annotations

import pytest

from areal_marlaas.bench.fairness import fairness, intersect, jain, union


def ev(task: str, phase: str, start: float, end: float) -> dict:
    return {"task": task, "version": 0, "phase": phase, "start": start, "end": end}


def test_jain_is_one_for_equal_shares_and_one_over_n_for_one_taker():
    assert jain([2.0, 2.0, 2.0]) == pytest.approx(1.0)
    assert jain([5.0, 0.0, 0.0, 0.0]) == pytest.approx(0.25)
    assert jain([]) is None and jain([0.0, 0.0]) is None


def test_union_and_intersect_of_intervals():
    assert union([(3, 4), (0, 1), (0.5, 2)]) == [(0, 2), (3, 4)]
    assert intersect([(0, 2), (3, 4)], [(1, 3.5)]) == [(1, 2), (3, 3.5)]


def test_only_time_when_every_tenant_is_backlogged_counts():
    # a trains alone 0-10; b queues at 10; both are backlogged 10-30 and
    # alternate 5 s steps; after 30 only b is left.
    events = [
        ev("a0", "train", 0, 10),
        ev("a0", "train", 10, 15),
        ev("b0", "queue", 10, 15),
        ev("b0", "train", 15, 20),
        ev("a0", "queue", 15, 20),
        ev("a0", "train", 20, 25),
        ev("b0", "queue", 20, 25),
        ev("b0", "train", 25, 30),
        ev("a0", "queue", 25, 30),
        ev("b0", "train", 30, 60),
    ]
    out = fairness(events, {"a0": "a", "b0": "b"})
    assert out["window_s"] == pytest.approx(20.0)
    served = out["weighted_trainer_s"]
    assert served == {"a": pytest.approx(10.0), "b": pytest.approx(10.0)}
    assert out["jain"] == pytest.approx(1.0)
    assert out["max_min_ratio"] == pytest.approx(1.0)


def test_weights_divide_the_trainer_time():
    events = [
        ev("h", "train", 0, 20),
        ev("l", "queue", 0, 20),
        ev("l", "train", 20, 30),
        ev("h", "queue", 20, 30),
    ]
    out = fairness(events, {"h": "heavy", "l": "light"}, {"heavy": 2.0})
    assert out["weighted_trainer_s"] == {"heavy": 10.0, "light": 10.0}
    assert out["shares"] == {"heavy": 0.5, "light": 0.5}
