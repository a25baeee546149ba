"""Held-out curves and time to quality: the learning bench's arithmetic."""

from __future__ import annotations

import pytest

from areal_marlaas.bench.time_to_quality import (
    curve,
    excludes_zero,
    gain,
    mean_ci,
    mean_start_over_orders,
    sequential_starts,
    t975,
    target,
    time_to,
)

T0 = 1_000.0


def evals(task: str, rewards: list[float | None], every: int = 2) -> list[dict]:
    """evals.jsonl lines of ``task``, one per ``every`` versions, 10 s apart."""
    return [
        {
            "task": task,
            "version": every * (i + 1),
            "reward_mean": r,
            "end": T0 + 10.0 * (i + 1),
        }
        for i, r in enumerate(rewards)
    ]


def test_a_curve_starts_at_the_base_and_skips_evals_that_failed():
    lines = evals("a", [0.3, None, 0.5]) + evals("b", [0.9])
    lines.append(
        {
            "task": "a",
            "version": 8,
            "reward_mean": 0.9,
            "end": T0 + 50,
            "error": "server down",
        }
    )
    points = curve(reversed(lines), "a", T0, base=0.2)
    assert [(p["version"], p["t"], p["reward"]) for p in points] == [
        (0, 0.0, 0.2),
        (2, 10.0, 0.3),
        (6, 30.0, 0.5),
    ]
    assert gain(points) == pytest.approx(0.3)


def test_time_to_target_is_the_first_eval_at_or_over_it():
    points = curve(evals("a", [0.3, 0.5, 0.4, 0.6]), "a", T0, base=0.2)
    assert time_to(points, 0.45) == 20.0
    assert time_to(points, 0.5) == 20.0
    assert time_to(points, 0.7) is None
    assert time_to(points, None) is None


def test_the_target_is_the_base_plus_a_fraction_of_the_alone_gain():
    assert target(0.2, [0.2, 0.4], 0.5) == pytest.approx(0.35)
    assert target(0.2, [0.1, -0.3], 0.5) is None  # alone did not gain: no bar


def test_sequential_runs_start_when_the_ones_before_end():
    durations = {"a": 100.0, "b": 50.0, "c": 30.0}
    assert sequential_starts(durations, ["b", "a", "c"]) == {
        "b": 0.0,
        "a": 50.0,
        "c": 150.0,
    }
    # Over the 6 orders of 3 runs, each other run precedes "c" in 3 of them.
    from itertools import permutations

    starts = [sequential_starts(durations, o)["c"] for o in permutations(durations)]
    assert mean_start_over_orders(durations, "c") == pytest.approx(
        sum(starts) / len(starts)
    )


def test_an_interval_that_straddles_zero_does_not_exclude_it():
    assert excludes_zero(mean_ci([0.10, 0.12, 0.14]))
    assert not excludes_zero(mean_ci([0.10, -0.05, 0.02]))
    assert not excludes_zero(mean_ci([0.1]))  # one seed: no interval
    half = mean_ci([1.0, 2.0, 3.0])["ci95"]
    assert half == pytest.approx(4.303 * 1.0 / 3**0.5)


def test_the_t_quantile_at_every_seed_count():
    # Exact values (scipy.stats.t.ppf(0.975, df)), the table's and beyond it.
    exact = {1: 12.706, 7: 2.365, 8: 2.306, 30: 2.042, 31: 2.040, 40: 2.021}
    exact |= {60: 2.000, 120: 1.980}
    for df, want in exact.items():
        assert t975(df) == pytest.approx(want, abs=0.003), df
    assert mean_ci([1.0] * 8 + [2.0])["ci95"] == pytest.approx(
        2.306 * (1 / 3) / 9**0.5, rel=1e-3
    )
    with pytest.raises(ValueError, match="degrees of freedom"):
        t975(0)
