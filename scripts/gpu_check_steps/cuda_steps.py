"""The GPU check's steps that run the plugin on the GPU: trainer_cuda,
rollout_multilora, logprob_agreement, quickstart and bench. Each plans its command
from the facts the setup and model steps recorded (or is skipped with the reason)
and reads what it wrote back into its metrics."""

from __future__ import annotations

import json
import os
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from gpu_check_steps.common import (
    AFTER_SETUP,
    STEPS_DIR,
    Command,
    Ctx,
    Skip,
    StepResult,
)
from gpu_check_steps.environment import (
    first_missing,
    gpu_info,
    need_gpu,
    need_model,
    need_trainer,
    need_vllm,
    trainer_env,
)


# -- what every GPU step shares --------------------------------------------------------
def device_overrides(ctx: Ctx) -> list[str]:
    """The GPU serving/training settings every vLLM step uses."""
    dtype = "bfloat16" if gpu_info(ctx) else "float32"
    return [
        f"vllm.dtype={dtype}",
        f"actor.dtype={dtype}",
        f"vllm.enforce_eager={str(ctx.args.vllm_eager).lower()}",
        f"vllm.gpu_memory_utilization={ctx.args.gpu_memory_utilization}",
    ]


def test_vllm_env(ctx: Ctx) -> str:
    """tests/conftest.py's vllm_server fixture reads MARLAAS_TEST_VLLM (JSON)."""
    dtype = "bfloat16" if gpu_info(ctx) else "float32"
    return json.dumps(
        {
            "dtype": dtype,
            "enforce_eager": ctx.args.vllm_eager,
            "gpu_memory_utilization": ctx.args.gpu_memory_utilization,
        }
    )


def split_cpus(n: int) -> dict[str, str]:
    n = max(n, 2)
    half = n // 2
    return {
        "server": f"0-{half - 1}" if half > 1 else "0",
        "trainer": f"{half}-{n - 1}" if n - 1 > half else str(half),
        "all": f"0-{n - 1}",
    }


def preview_needs(*needs):
    def preview(ctx: Ctx):
        if "trainer" not in ctx.facts:  # a real run plans before setup's probes
            return AFTER_SETUP, ""
        for need in needs:
            if need is need_model:
                continue  # decided by the model step at run time
            why = need(ctx)
            if why:
                return "skip", why
        return "run", ""

    return preview


# -- trainer_cuda: the plugin's FSDP trainer alone -------------------------------------
def step_trainer_cuda(ctx: Ctx):
    why = first_missing(ctx, need_gpu, need_trainer, need_model)
    if why:
        return Skip(why)
    t = ctx.facts["trainer"]
    argv = [
        t["python"],
        str(STEPS_DIR / "trainer_cuda.py"),
        "--model-json",
        str(ctx.work / "model.result.json"),
        "--work",
        str(ctx.work / "trainer_cuda"),
    ]
    if ctx.args.quick:  # CPU testing: fewer steps, the tiny Llama as the main model
        argv += ["--quick", "--main-model", ctx.facts["model"]["tiny"]["llama"]]
    return Command(
        argv,
        env=trainer_env(ctx),
        result_file=str(ctx.work / "trainer_cuda.result.json"),
    )


# -- rollout_multilora: the multi-LoRA rollout tests on a CUDA vLLM server -------------
def step_rollout(ctx: Ctx):
    why = first_missing(ctx, need_gpu, need_trainer, need_vllm, need_model)
    if why:
        return Skip(why)
    junit = ctx.work / "junit-rollout.xml"
    env = trainer_env(ctx)
    env["MARLAAS_TEST_VLLM"] = test_vllm_env(ctx)
    return Command(
        [
            ctx.facts["trainer"]["python"],
            "-m",
            "pytest",
            "tests/e2e/test_rollout_multilora.py",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--junitxml={junit}",
        ],
        env=env,
    )


def parse_junit(path: Path) -> dict[str, Any]:
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    out: dict[str, Any] = {"passed": 0, "failed": 0, "skipped": 0, "tests": []}
    for s in suites:
        for case in s.iter("testcase"):
            name = case.get("name")
            t = float(case.get("time") or 0)
            bad = (
                case.find("failure")
                if case.find("failure") is not None
                else case.find("error")
            )
            if bad is not None:
                out["failed"] += 1
                msg = (bad.get("message") or bad.text or "")[:400]
                out["tests"].append(
                    {"name": name, "status": "failed", "s": t, "error": msg}
                )
            elif case.find("skipped") is not None:
                out["skipped"] += 1
                out["tests"].append({"name": name, "status": "skipped", "s": t})
            else:
                out["passed"] += 1
                out["tests"].append({"name": name, "status": "ok", "s": t})
    return out


def post_rollout(ctx: Ctx, res: StepResult) -> None:
    junit = ctx.work / "junit-rollout.xml"
    if junit.is_file():
        res.metrics.update(parse_junit(junit))


# -- logprob_agreement: vLLM vs trainer logprobs of a trained adapter ------------------
def step_logprob(ctx: Ctx):
    why = first_missing(ctx, need_gpu, need_trainer, need_vllm, need_model)
    if why:
        return Skip(why)
    dtypes = "bfloat16,float32" if gpu_info(ctx) else "float32"
    return Command(
        [
            ctx.facts["trainer"]["python"],
            str(STEPS_DIR / "logprob_gap.py"),
            "--dtypes",
            dtypes,
            "--work",
            str(ctx.work / "logprob"),
            "--eager",
            str(ctx.args.vllm_eager).lower(),
            "--gpu-memory-utilization",
            str(ctx.args.gpu_memory_utilization),
        ],
        env=trainer_env(ctx),
        result_file=str(ctx.work / "logprob.result.json"),
    )


# -- quickstart: marlaas train on the quickstart config --------------------------------
def step_quickstart(ctx: Ctx):
    why = first_missing(ctx, need_gpu, need_trainer, need_vllm, need_model)
    if why:
        return Skip(why)
    return Command(
        [
            ctx.facts["trainer"]["python"],
            "-m",
            "areal_marlaas.cli",
            "train",
            "--config",
            "configs/quickstart.yaml",
            f"cluster.fileroot={ctx.work / 'runs'}",
            "experiment_name=gpu-check-quickstart",
            "trial_name=t0",
            *device_overrides(ctx),
            *ctx.args.quickstart_arg,
        ],
        env=trainer_env(ctx),
    )


def post_quickstart(ctx: Ctx, res: StepResult) -> None:
    f = ctx.work / "runs" / "gpu-check-quickstart" / "t0" / "summary.json"
    if not f.is_file():
        return
    s = json.loads(f.read_text())
    res.metrics["wall_s"] = s.get("wall_s")
    res.metrics["train_steps_per_hour"] = s.get("train_steps_per_hour")
    res.metrics["tasks"] = {
        name: {
            k: t.get(k)
            for k in (
                "status",
                "steps",
                "final_version",
                "reward_first",
                "reward_last",
                "error",
            )
        }
        for name, t in (s.get("tasks") or {}).items()
    }


# -- bench: async vs sync vs sequential ------------------------------------------------
def step_bench(ctx: Ctx):
    why = first_missing(ctx, need_gpu, need_trainer, need_vllm, need_model)
    if why:
        return Skip(why)
    cpus = split_cpus(os.cpu_count() or 2)
    return Command(
        [
            ctx.facts["trainer"]["python"],
            "-m",
            "areal_marlaas.cli",
            "bench",
            "--config",
            "configs/bench.yaml",
            f"bench.replicas={ctx.args.bench_tenants}",
            f"bench.steps={ctx.args.bench_steps}",
            "bench.modes=[async,sync,sequential]",
            "bench.ablations=[]",
            "bench.concurrency=[]",
            "bench.warmup_run=false",
            f"bench.out={ctx.work / 'bench'}",
            f"bench.work_dir={ctx.work / 'bench-runs'}",
            f"bench.server_cpus={cpus['server']}",
            f"bench.trainer_cpus={cpus['trainer']}",
            f"bench.collocated_cpus={cpus['all']}",
            f"cluster.fileroot={ctx.work / 'runs'}",
            *device_overrides(ctx),
            *ctx.args.bench_arg,
        ],
        env=trainer_env(ctx),
    )


def post_bench(ctx: Ctx, res: StepResult) -> None:
    f = ctx.work / "bench" / "bench.json"
    if not f.is_file():
        return
    res.metrics["modes"] = bench_modes(json.loads(f.read_text()))
    for name in ("bench.json", "bench.md"):
        src = ctx.work / "bench" / name
        if src.is_file():
            shutil.copy(src, ctx.out / name)


def bench_modes(data: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for r in data.get("runs", []):
        if r.get("group") not in (None, "mode"):
            continue
        m = r.get("metrics") or {}
        out[r.get("mode") or r.get("label")] = {
            "status": r.get("status"),
            "wall_s": m.get("wall_s"),
            "train_steps_per_hour": m.get("train_steps_per_hour"),
            "steps": m.get("steps"),
            "tenants": r.get("tenants"),
        }
    return out
