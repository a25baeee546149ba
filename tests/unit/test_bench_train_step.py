"""`marlaas bench-train-step`: the engine in its own processes, timed and
FLOP-counted on a tiny model, against the recorded steps of superseded code
(the real model's numbers: docs/results.md)."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

import pytest

from areal_marlaas.bench.train_step import (
    REFERENCE,
    VARIANTS,
    WORKLOAD,
    compare,
    format_reference,
    format_table,
    load_reference,
    make_batch,
    summarize,
)
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
        for v, times in (("engine", (1.0, 3.0)), ("engine_glibc_heap", (4.0, 4.0)))
        for s in times
    ]
    rows = {r["variant"]: r for r in summarize(runs)}
    assert rows["engine"]["step_s_mean"] == 2.0
    assert rows["engine"]["step_s_sd"] == pytest.approx(2**0.5)
    assert rows["engine"]["speedup_vs"]["engine_glibc_heap"] == 2.0
    assert rows["engine_glibc_heap"]["speedup_vs"]["engine"] == 0.5
    assert rows["engine"]["repeats"] == 2
    assert rows["engine"]["page_faults_mean"] == 200


def test_reference_holds_measured_steps_of_code_no_variant_runs():
    ref = load_reference()
    assert REFERENCE.is_file() and ref["sessions"]
    # Recorded paths are superseded code: none is a live variant.
    assert not set(ref["paths"]) & set(VARIANTS)
    for s in ref["sessions"]:
        assert s["command"].startswith("marlaas bench-train-step ")
        assert s["machine"]["cpu"] and s["machine"]["cores_usable"] > 0
        assert set(WORKLOAD) <= set(s["options"])
        assert s["rows"]
        for r in s["rows"]:
            assert r["path"] in ref["paths"]
            # The mean is the rounds' (each a process's timed steps).
            assert len(r["step_s_per_round"]) == r["repeats"]
            assert statistics.mean(r["step_s_per_round"]) == pytest.approx(
                r["step_s_mean"], rel=1e-3
            )
            assert 0 < r["share_of_gemm"] < 1 and r["gflop_per_step"] > 0
            assert r["achieved_gflops_mean"] == pytest.approx(
                r["gflop_per_step"] / r["step_s_mean"], rel=0.1
            )


def _row(step_s: float) -> dict:
    return {
        "variant": "engine",
        "repeats": 1,
        "step_s_mean": step_s,
        "step_s_sd": 0.0,
        "first_step_s_mean": step_s,
        "first_step_s_sd": 0.0,
        "tokens": 1144,
        "gflop_per_step": 578.0,
        "achieved_gflops_mean": 578.0 / step_s,
        "achieved_gflops_sd": 0.0,
        "gemm_gflops_mean": 180.0,
        "share_of_gemm": 0.6,
        "page_faults_mean": None,
    }


def test_speedups_only_over_sessions_of_the_same_machine_and_workload():
    ref = load_reference()
    session = ref["sessions"][-1]
    machine, options = dict(session["machine"]), dict(session["options"])
    rows = [_row(5.0)]
    compare(rows, ref, machine, options)
    mine = [v for v in rows[0]["vs_reference"] if v["session"] == session["date"]]
    assert [v["path"] for v in mine] == [r["path"] for r in session["rows"]]
    for v, r in zip(mine, session["rows"], strict=False):
        assert v["speedup"] == pytest.approx(r["step_s_mean"] / 5.0)
    assert "x |" in format_table(rows)
    assert "| yes |" in format_reference(ref, machine, options)
    # Another CPU, or another batch shape: nothing to compare with.
    for other_machine, other_options in (
        ({**machine, "cpu": "Another CPU"}, options),
        (machine, {**options, "lens": [10, 20]}),
        (machine, {**options, "threads": 16}),
    ):
        compare(rows, ref, other_machine, other_options)
        assert rows[0]["vs_reference"] == []
        assert format_table(rows).endswith("| - |")
        assert "| yes |" not in format_reference(ref, other_machine, other_options)


def test_superseded_paths_are_not_variants_any_more(capsys):
    from areal_marlaas.cli import main

    assert main(["bench-train-step", "--variants", "engine,masked_compiled"]) == 2
    assert "unknown ['masked_compiled']" in capsys.readouterr().err


def test_cli_times_and_counts_the_engine_both_heaps(tmp_path):
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
        "engine,engine_glibc_heap",
        "--out",
        str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads((out / "train_step.json").read_text())
    rows = {r["variant"]: r for r in result["rows"]}
    assert set(rows) == {"engine", "engine_glibc_heap"}
    # The heap setting changes no computation, only where memory comes from.
    assert (
        rows["engine_glibc_heap"]["gflop_per_step"] == rows["engine"]["gflop_per_step"]
    )
    assert all(r["page_faults"] for r in result["runs"])
    for r in rows.values():
        assert r["step_s_mean"] > 0 and r["gemm_gflops_mean"] > 0
        assert r["gflop_per_step"] > 0
        # A tiny model is not the recorded workload: no speed-up claimed.
        assert r["vs_reference"] == []
    report = (out / "train_step.md").read_text()
    assert "| engine | 1 |" in report and "| engine_glibc_heap | 1 |" in report
    # The recorded paths are listed, none compared.
    assert "| masked_compiled |" in report and "| yes |" not in report
