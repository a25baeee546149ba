"""The replicated AReaL baseline's parts that need no server: its plan, the
replica's command mirroring the task, the memory projection that refuses a run
that would not fit, and the memory the sampler reads."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys

import pytest

from areal_marlaas.bench.areal_replica import load_spec, task_arguments
from areal_marlaas.bench.plan import REPLICATED, plan_runs
from areal_marlaas.bench.replicated import execute_replicated, replica_command
from areal_marlaas.bench.run_metrics import memory_peaks
from areal_marlaas.bench.sampler import machine_used_bytes, tree_memory_bytes
from areal_marlaas.config import BenchConfig, ConfigError, load_config
from areal_marlaas.config.bench import BenchRunConfig
from tests.support.paths import REPO


def bench_cfg(*overrides: str) -> BenchRunConfig:
    cfg, _ = load_config(
        ["--config", str(REPO / "configs" / "bench.yaml"), *overrides], BenchRunConfig
    )
    return cfg


def test_replicated_runs_are_planned_per_tenant_count():
    cfg = bench_cfg(
        "bench.modes=[async]",
        "bench.ablations=[]",
        "bench.concurrency=[2,4]",
        "bench.replicated=[4,2]",
    )
    plans = [p for p in plan_runs(cfg.bench, cfg) if p.placement == REPLICATED]
    assert [(p.label, p.tenants) for p in plans] == [("areal_x2", 2), ("areal_x4", 4)]
    # The same tenants as MARLaaS's sweep runs at that count.
    sweep = {p.label: p for p in plan_runs(cfg.bench, cfg)}
    assert plans[1].tasks == sweep["async_c4"].tasks
    with pytest.raises(ConfigError, match="bench.replicated"):
        BenchConfig(replicated=[0])


def test_a_replica_gets_its_tasks_settings(tmp_path):
    cfg = bench_cfg("bench.replicated=[2]", "vllm.max_model_len=384")
    spec = plan_runs(cfg.bench, cfg)[-1].tasks[1]
    path = tmp_path / "t.yaml"
    from omegaconf import OmegaConf

    OmegaConf.save(OmegaConf.create(dataclasses.asdict(spec)), path)
    assert load_spec(str(path)) == spec
    cmd = replica_command(cfg.bench, cfg, spec, path, "x-1", tmp_path)
    for arg in (
        f"seed={spec.seed}",
        f"total_train_steps={spec.total_steps}",
        f"train_dataset.batch_size={spec.batch_size}",
        f"gconfig.n_samples={spec.n_samples}",
        f"gconfig.max_new_tokens={spec.max_new_tokens}",
        f"actor.optimizer.lr={spec.lr}",
        "vllm.max_model_len=384",
        "trial_name=x-1",
    ):
        assert arg in cmd, arg
    assert task_arguments(spec) == cmd[cmd.index("--config") + 2 :][:9]


def test_a_run_projected_past_the_memory_limit_is_not_started(tmp_path):
    cfg = bench_cfg("bench.replicated=[2,8]")
    plan = [p for p in plan_runs(cfg.bench, cfg) if p.label == "areal_x8"][0]
    previous = {"label": "areal_x2", "tenants": 2, "metrics": {"peak_mem_gib": 6.0}}
    r = execute_replicated(cfg.bench, cfg, plan, tmp_path, 0, previous, 20.0)
    assert r["status"] == "does_not_fit"
    assert r["projected_gib"] == pytest.approx(24.0)
    assert "24.0 GiB > 20.0 GiB" in r["error"]
    assert not (tmp_path / "replicated").exists()  # nothing was launched


# A child that holds 300 MiB (every page touched), says so, then waits.
HOLDER = (
    "import sys, time; b = bytearray(300 * 2**20); b[::4096] = b'x' * len(b[::4096]);"
    " print('held', flush=True); time.sleep(60)"
)


def test_memory_of_a_process_tree_and_its_peak():
    # parent -> child: the child's memory counts for the parent's tree.
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys; "
            f"subprocess.run([sys.executable, '-c', {HOLDER!r}])",
        ],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # one group to end, the child with it
    )
    try:
        assert parent.stdout is not None and parent.stdout.readline() == "held\n"
        mem = tree_memory_bytes(parent.pid)  # the child holds the 300 MiB
        assert 300 * 2**20 < mem < 400 * 2**20, mem / 2**20
        assert tree_memory_bytes([parent.pid, parent.pid]) >= 2 * 300 * 2**20
        assert machine_used_bytes() > mem
    finally:
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()
    samples = [
        {"server_mem": 1 * 2**30, "trainer_mem": 2 * 2**30, "machine_mem": 9 * 2**30},
        {"server_mem": 1 * 2**30, "trainer_mem": 4 * 2**30, "machine_mem": 8 * 2**30},
    ]
    assert memory_peaks(samples) == {"peak_mem_gib": 5.0, "peak_machine_gib": 9.0}
