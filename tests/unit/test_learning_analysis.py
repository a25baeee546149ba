"""The learning bench's conclusions from run records (no training here)."""

from __future__ import annotations

import json

import pytest

from areal_marlaas.bench.learning_analysis import (
    alone_label,
    analyse,
    audit,
    together_label,
)
from areal_marlaas.bench.learning_report import write

SEEDS = [1, 2, 3]
T0 = 5_000.0


def run(task_rewards: dict[str, list[float]], wall_s: float, every_s: float) -> dict:
    """A run whose tasks' evals (v2, v4, ...) end ``every_s`` apart."""
    evals = [
        {
            "task": t,
            "version": 2 * (i + 1),
            "reward_mean": r,
            "end": T0 + every_s * (i + 1),
        }
        for t, rewards in task_rewards.items()
        for i, r in enumerate(rewards)
    ]
    return {"t0": T0, "wall_s": wall_s, "evals": evals, "steps": []}


def fake_runs(together_a: list[float]) -> dict[str, dict]:
    runs = {}
    for seed in SEEDS:
        runs[alone_label(seed, "a")] = run({"a": [0.3, 0.4, 0.5]}, 100.0, 30.0)
        runs[alone_label(seed, "b")] = run({"b": [0.1, 0.2, 0.2]}, 60.0, 20.0)
        runs[together_label(seed)] = run(
            {"a": together_a, "b": [0.1, 0.2, 0.2]}, 120.0, 35.0
        )
    return runs


BASES = {s: {"a": 0.2, "b": 0.1} for s in SEEDS}


def test_gains_their_intervals_and_the_together_alone_difference():
    out = analyse(["a", "b"], SEEDS, fake_runs([0.3, 0.4, 0.6]), BASES, 0.5)
    a = out["per_task"]["a"]
    assert a["gain_alone"]["mean"] == pytest.approx(0.3)
    assert a["together_minus_alone"]["mean"] == pytest.approx(0.1)
    # Identical seeds: sd 0, an interval of width 0 that excludes 0.
    assert a["gain_alone"]["excludes_0"] and a["together_minus_alone"]["excludes_0"]
    assert a["targets"][1] == pytest.approx(0.2 + 0.5 * 0.3)


def test_time_to_target_together_against_the_runs_one_after_another():
    out = analyse(["a", "b"], SEEDS, fake_runs([0.3, 0.4, 0.6]), BASES, 0.5)
    a = out["timing"]["time_to_target"]["a"]["per_seed"][0]
    # Target 0.35: alone reaches 0.4 at its 2nd eval (60 s), first in order.
    assert (a["alone_s"], a["sequential_s"]) == (60.0, 60.0)
    assert a["together_s"] == 70.0  # 2nd eval of the shared run, 35 s apart
    b = out["timing"]["time_to_target"]["b"]["per_seed"][0]
    # Target 0.1 + 0.5 x 0.1 = 0.15: b's 2nd eval (40 s), after a's 100 s run.
    assert (b["alone_s"], b["sequential_s"]) == (40.0, 140.0)
    assert b["sequential_any_order_s"] == 40.0 + 100.0 / 2
    done = out["timing"]["all_done"]
    assert done["ratio"]["mean"] == pytest.approx(120.0 / 160.0)


def test_a_task_that_never_reaches_its_target_together_has_no_time():
    out = analyse(["a", "b"], SEEDS, fake_runs([0.2, 0.2, 0.2]), BASES, 0.5)
    a = out["timing"]["time_to_target"]["a"]
    assert all(p["together_s"] is None for p in a["per_seed"])
    assert a["ratio_to_sequential"]["of_seeds"] == 0
    # Together gained nothing: 0.3 below alone, an interval below 0.
    assert out["per_task"]["a"]["together_minus_alone"]["mean"] == pytest.approx(-0.3)


def test_the_audit_flags_a_step_served_by_another_version_or_over_the_gap():
    ok = {
        "task": "a",
        "version": 3,
        "served_adapters": ["a-v2"],
        "logprob_gap_mean": 1e-5,
    }
    assert audit([ok], 0.01)["holds"]
    assert not audit([], 0.01)["holds"]  # nothing audited proves nothing
    stale = {**ok, "served_adapters": ["a-v1"]}
    assert audit([ok, stale], 0.01)["served_other"] == ["a v3"]
    far = {**ok, "logprob_gap_mean": 0.5}
    assert audit([far], 0.01)["over_limit"] == 1 and not audit([far], 0.01)["holds"]


def test_the_report_and_plots_are_written_from_the_saved_json(tmp_path):
    out = analyse(["a", "b"], SEEDS, fake_runs([0.3, 0.4, 0.6]), BASES, 0.5)
    runs = fake_runs([0.3, 0.4, 0.6])
    result = {
        "seeds": SEEDS,
        "steps": 6,
        "eval_every": 2,
        "eval_prompts": 64,
        "target_fraction": 0.5,
        "held_out_overlap": {"a": 0, "b": 0},
        "tasks": {},
        "bases": BASES,
        "runs": {k: {"wall_s": v["wall_s"]} for k, v in runs.items()},
        "audit": audit([], 0.01),
        **out,
    }
    write(result, tmp_path)
    saved = json.loads((tmp_path / "learning.json").read_text())
    assert saved["per_task"]["a"]["gain_alone"]["mean"] == pytest.approx(0.3)
    text = (tmp_path / "learning.md").read_text()
    assert "| a | 0.200 [+-0.000] | 0.300 [+-0.000]" in text
    assert (tmp_path / "learning_time.png").stat().st_size > 10_000
    assert (tmp_path / "learning_steps.png").stat().st_size > 10_000
