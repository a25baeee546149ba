"""``marlaas bench`` end to end on the real server and trainer, in one small
invocation whose outputs two checks read: the async mode of two tenants and the
replicated baseline, one tenant as its own AReaL PPOTrainer job with its own
server. Every mode runs through the same planned ``marlaas train`` (the modes
themselves: test_modes_e2e.py). Slow: ``make test-live``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.paths import REPO

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    """The bench's output folder and work folder, after one run."""
    tmp = tmp_path_factory.mktemp("bench")
    out, work = tmp / "out", tmp / "work"
    cmd = [
        sys.executable,
        "-m",
        "areal_marlaas.cli",
        "bench",
        "--config",
        str(REPO / "configs" / "bench.yaml"),
        "bench.modes=[async]",
        "bench.ablations=[]",
        "bench.concurrency=[]",
        "bench.replicas=2",
        "bench.replicated=[1]",
        "bench.repeats=1",
        "bench.steps=1",
        "bench.warmup_run=false",
        f"bench.out={out}",
        f"bench.work_dir={work}",
        "tasks.0.batch_size=2",
        "tasks.0.n_samples=2",
        "tasks.0.max_new_tokens=16",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, work


def runs_of(out) -> dict:
    result = json.loads((out / "bench.json").read_text())
    return {r["label"]: r for r in result["runs"]}


def test_bench_of_two_tenants_writes_results(bench):
    out, _ = bench
    runs = runs_of(out)
    assert set(runs) == {"async", "areal_x1"}
    r = runs["async"]
    assert r["status"] == "ok", r.get("log_tail")
    assert r["metrics"]["steps"] == 2
    assert r["metrics"]["train_util_cpu"] > 0
    assert (out / "timeline.png").is_file()
    assert not list(out.rglob("*.safetensors"))


def test_bench_runs_a_tenant_as_its_own_areal_job(bench):
    out, work = bench
    r = runs_of(out)["areal_x1"]
    assert (r["status"], r["steps_by_replica"]) == ("ok", [1])
    m = r["metrics"]
    # Its own server and trainer: more than the model's weights, less than all.
    assert 1.0 < m["peak_mem_gib"] < m["peak_machine_gib"], m
    assert m["e2e_steps_per_hour"] == pytest.approx(3600 / r["process_s"])
    log = (work / "replicated" / "areal_x1" / "mul1_0.log").read_text()
    assert "published mul1_0-v1" in log  # the task's own adapter, on-policy path
    assert "| 1 | - | " in (out / "bench.md").read_text()  # no MARLaaS run at 1
