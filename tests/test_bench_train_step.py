"""`marlaas bench-train-step`: each attention path in its own process, timed and
FLOP-counted, on a tiny model (the real model's numbers: docs/results.md)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from areal_marlaas.bench.train_step import make_batch, summarize
from areal_marlaas.model_prep import make_tiny_model


def test_batch_is_on_policy_and_masks_the_prompt():
    groups = make_batch(3, 4, (10, 20), 6, version=5, vocab=100, seed=0)
    assert len(groups) == 3
    for g in groups:
        n = g["attention_mask"].sum(-1)
        assert n.min() >= 10 and n.max() <= 20
        assert not g["loss_mask"][:, :6].any()
        assert (g["loss_mask"].sum(-1) == n - 6).all()
        gen = g["versions"][g["loss_mask"].bool()]
        assert gen.numel() and (gen == 5).all()


def test_summary_means_sds_and_speedups():
    runs = [
        {
            "variant": v,
            "step_s": [s, s],
            "first_step_s": 2 * s,
            "tokens": 100,
            "flops": 1e9,
            "achieved_gflops": 1 / s,
            "gemm_gflops": 10.0,
            "page_faults": [100 * s],
        }
        for v, times in (("packed", (1.0, 3.0)), ("masked", (4.0, 4.0)))
        for s in times
    ]
    rows = {r["variant"]: r for r in summarize(runs)}
    assert rows["packed"]["step_s_mean"] == 2.0
    assert rows["packed"]["step_s_sd"] == pytest.approx(2**0.5)
    assert rows["packed"]["speedup_vs"]["masked"] == 2.0
    assert rows["masked"]["speedup_vs"]["packed"] == 0.5
    assert rows["packed"]["repeats"] == 2
    assert rows["packed"]["page_faults_mean"] == 200


def test_cli_times_and_counts_both_paths(tmp_path):
    model = make_tiny_model(tmp_path / "tiny", arch="llama")
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        "-m",
        "areal_marlaas.cli",
        "bench-train-step",
        "--model",
        str(model),
        "--threads",
        "1",
        "--rounds",
        "1",
        "--steps",
        "1",
        "--groups",
        "2",
        "--group-size",
        "2",
        "--lens",
        "12,20",
        "--prompt",
        "4",
        "--variants",
        "engine,engine_glibc_heap,packed,masked",
        "--out",
        str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads((out / "train_step.json").read_text())
    rows = {r["variant"]: r for r in result["rows"]}
    assert set(rows) == {"engine", "engine_glibc_heap", "packed", "masked"}
    # The heap setting changes no computation, only where memory comes from.
    assert (
        rows["engine_glibc_heap"]["gflop_per_step"] == rows["engine"]["gflop_per_step"]
    )
    assert all(r["page_faults"] for r in result["runs"])
    for r in rows.values():
        assert r["step_s_mean"] > 0 and r["gemm_gflops_mean"] > 0
        assert r["gflop_per_step"] > 0
    # Same batch, same model: the FLOP counter sees the same matmuls, plus the
    # masked path's page padding (its packs are padded to 256 tokens).
    assert rows["masked"]["gflop_per_step"] > rows["packed"]["gflop_per_step"]
    # The engine drops the audit's forward and the prompt rows of the LM head.
    assert rows["packed"]["gflop_per_step"] > rows["engine"]["gflop_per_step"]
    assert "| packed | 1 |" in (out / "train_step.md").read_text()
