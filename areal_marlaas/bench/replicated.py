"""The replicated AReaL baseline of ``marlaas bench``: N tenants as N independent
AReaL PPOTrainer jobs (bench/areal_replica.py), each starting its own vLLM
server and trainer, launched together on the whole machine (AReaL's default
placement: nothing pinned). Measured end to end, start-up included, since each
job pays its own; memory sampled over every replica's process tree (PSS) and
over the whole machine."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
from omegaconf import OmegaConf

from areal_marlaas.bench.plan import RunPlan
from areal_marlaas.bench.run_metrics import memory_peaks
from areal_marlaas.bench.sampler import UtilizationSampler
from areal_marlaas.config import BenchConfig, MARLaaSConfig
from areal_marlaas.procs import stop_group, tail

# AReaL's PPOTrainer logs one line per finished step.
STEP_LINE = re.compile(r"Train step (\d+)/")


def replica_command(
    bench: BenchConfig,
    cfg: MARLaaSConfig,
    spec,
    task_file: Path,
    trial: str,
    root: Path,
) -> list[str]:
    from areal_marlaas.bench.areal_replica import task_arguments

    return [
        sys.executable,
        "-m",
        "areal_marlaas.bench.areal_replica",
        "--task-file",
        str(task_file),
        "--config",
        str(Path(bench.replicated_config).resolve()),
        *task_arguments(spec),
        "experiment_name=marlaas-replicated",
        f"trial_name={trial}",
        f"cluster.fileroot={root}",
        f"cluster.name_resolve.nfs_record_root={root / 'name_resolve'}",
        f"vllm.max_model_len={cfg.vllm.max_model_len}",
        f"actor.lora_rank={cfg.actor.lora_rank}",
        f"actor.lora_alpha={cfg.actor.lora_alpha}",
    ]


def _descendants(procs: list[subprocess.Popen]) -> list[psutil.Process]:
    out = []
    for p in procs:
        with contextlib.suppress(psutil.Error):
            out += psutil.Process(p.pid).children(recursive=True)
    return out


def projected_gib(previous: dict[str, Any] | None, tenants: int) -> float | None:
    """This run's memory, projected per replica from a smaller measured one."""
    if not previous:
        return None
    peak = (previous.get("metrics") or {}).get("peak_mem_gib")
    if not peak:
        return None
    return peak / previous["tenants"] * tenants


def execute_replicated(
    bench: BenchConfig,
    cfg: MARLaaSConfig,
    plan: RunPlan,
    work: Path,
    repeat: int,
    previous: dict[str, Any] | None,
    limit_gib: float,
) -> dict[str, Any]:
    label = plan.label if bench.repeats == 1 else f"{plan.label}.r{repeat}"
    result: dict[str, Any] = {
        "label": label,
        "config": plan.label,
        "repeat": repeat,
        "scheduler": "local",
        "mode": plan.mode,
        "placement": plan.placement,
        "group": plan.group,
        "tenants": plan.tenants,
        "command": "python -m areal_marlaas.bench.areal_replica --config "
        f"{bench.replicated_config} (x{plan.tenants})",
    }
    projected = projected_gib(previous, plan.tenants)
    if projected is not None and projected > limit_gib:
        assert previous is not None  # projected from it
        result.update(
            status="does_not_fit",
            error=f"projected {projected:.1f} GiB > {limit_gib:.1f} GiB "
            f"({previous['label']}: {previous['metrics']['peak_mem_gib']:.1f} GiB "
            f"for {previous['tenants']})",
            projected_gib=projected,
        )
        return result
    root = work / "replicated" / label
    root.mkdir(parents=True, exist_ok=True)
    (root / "name_resolve").mkdir(exist_ok=True)
    env = {**os.environ, "MARLAAS_REPLICA_KV_GIB": f"{bench.replicated_kv_gib:g}"}
    for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE"):
        env.pop(k, None)
    procs, logs = [], []
    t0 = time.monotonic()
    for i, spec in enumerate(plan.tasks):
        task_file = root / f"{spec.name}.task.yaml"
        OmegaConf.save(OmegaConf.create(dataclasses.asdict(spec)), task_file)
        cmd = replica_command(bench, cfg, spec, task_file, f"{label}-{i}", root)
        log = root / f"{spec.name}.log"
        logs.append(log)
        with open(log, "wb") as f:
            procs.append(
                subprocess.Popen(
                    cmd,
                    stdout=f,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    env=env,
                )
            )
    sampler = UtilizationSampler(
        None, [p.pid for p in procs], None, bench.sample_interval_s
    ).start()
    deadline = t0 + bench.run_timeout_s
    try:
        for p in procs:
            try:
                p.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                break
    finally:
        # A timeout or Ctrl-C: AReaL's workers run in their own sessions, so
        # stopping a job's group would leave them; take every descendant too.
        family = _descendants(procs)
        for p in procs:
            stop_group(p, timeout=10)
        for child in family:
            with contextlib.suppress(psutil.Error):
                child.kill()
        samples = sampler.stop()
    wall = max(1e-9, time.monotonic() - t0)
    codes = [p.returncode for p in procs]
    steps = []
    for log in logs:
        text = log.read_text(errors="replace") if log.exists() else ""
        done = [int(m) for m in STEP_LINE.findall(text)]
        steps.append(max(done, default=0))
    ok = all(c == 0 for c in codes) and all(
        s == t.total_steps for s, t in zip(steps, plan.tasks, strict=True)
    )
    result["returncodes"] = codes
    result["steps_by_replica"] = steps
    result["process_s"] = wall
    result["status"] = "ok" if ok else "failed"
    if not ok:
        killed = [i for i, c in enumerate(codes) if c in (-9, 137)]
        why = f"return codes {codes}, steps {steps}"
        if killed:
            why += f"; replicas {killed} killed (SIGKILL: out of memory?)"
        result["error"] = why
        bad = next((i for i, c in enumerate(codes) if c != 0), 0)
        result["log_tail"] = tail(logs[bad], 25)
    total = sum(steps)
    result["metrics"] = {
        "steps": total,
        "wall_s": wall,
        "e2e_s": wall,
        "train_steps_per_hour": total / wall * 3600,
        "e2e_steps_per_hour": total / wall * 3600,
        **memory_peaks(samples),
    }
    return result
