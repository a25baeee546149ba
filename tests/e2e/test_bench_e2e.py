"""`marlaas bench` end to end on the real server and trainer (slow: two server
starts would be needed for collocated, so this runs two disaggregated modes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


def test_bench_two_modes_two_tenants_writes_results(tmp_path, model_path):
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        "-m",
        "areal_marlaas.cli",
        "bench",
        "--config",
        str(REPO / "configs" / "bench.yaml"),
        "bench.modes=[async,sequential]",
        "bench.ablations=[]",
        "bench.concurrency=[]",
        "bench.replicas=2",
        "bench.repeats=1",
        "bench.steps=1",
        "bench.warmup_run=false",
        f"bench.out={out}",
        f"bench.work_dir={tmp_path / 'work'}",
        "tasks.0.batch_size=2",
        "tasks.0.n_samples=2",
        "tasks.0.max_new_tokens=16",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((out / "bench.json").read_text())
    runs = {r["label"]: r for r in result["runs"]}
    assert set(runs) == {"async", "sequential"}
    for r in runs.values():
        assert r["status"] == "ok", r.get("log_tail")
        assert r["metrics"]["steps"] == 2
        assert r["metrics"]["train_util_cpu"] > 0
    assert runs["sequential"]["ratios"]["speedup_vs_sequential"] == 1.0
    assert (out / "timeline.png").is_file()
    assert not list(out.rglob("*.safetensors"))
