"""The research-script examples run as documented."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from areal_marlaas.rundir.reader import read_jsonl
from tests.support.paths import REPO

pytestmark = pytest.mark.vllm


# Rendezvous settings an in-process engine of an earlier test left in this
# process's environment; a script must pick its own.
_RANK_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE")


def run(argv: list[str], timeout: int = 900) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in _RANK_VARS}
    return subprocess.run(
        [sys.executable, *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


# AReaL's own launcher starts its own vLLM server and trainer: ~2 min on 2 cores,
# so it runs with the slow set in CI (`make test-live`).
@pytest.mark.slow
def test_single_task_through_areal_ppotrainer(tmp_path):
    (tmp_path / "nr").mkdir()

    proc = run(
        [
            str(REPO / "examples" / "single_task_ppotrainer.py"),
            "--config",
            str(REPO / "examples" / "single_task_ppotrainer.yaml"),
            f"cluster.fileroot={tmp_path}",
            f"cluster.name_resolve.nfs_record_root={tmp_path / 'nr'}",
        ]
    )

    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    # AReaL's loop ran both steps and each LoRA update went out as a new name.
    assert "Train step 2/" in out
    assert "published add1-v1" in out and "published add1-v2" in out


def test_multi_task_script_trains_every_task(tmp_path, vllm_server):
    argv = [str(REPO / "examples" / "multi_task.py")]
    argv += ["--config", str(REPO / "configs" / "quickstart.yaml")]
    argv += [f"cluster.fileroot={tmp_path}", "trial_name=example"]
    argv += [f'server.addresses=["{vllm_server.address}"]']
    for i in range(3):
        argv += [f"tasks.{i}.total_steps=1", f"tasks.{i}.batch_size=2"]
        argv += [f"tasks.{i}.n_samples=2", f"tasks.{i}.max_new_tokens=16"]

    proc = run(argv)

    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    steps = read_jsonl(tmp_path / "marlaas-quickstart" / "example" / "steps.jsonl")
    for task in ("add2", "mul1", "add1"):
        assert f"{task}: 1 steps" in proc.stdout
        assert [
            (r["version"], r["staleness_max"]) for r in steps if r["task"] == task
        ] == [(1, 0)]
