"""CPU multi-LoRA serving: vLLM's LoRA ops vs the grouped plugin, bf16 vs float32.

Starts one server per configuration (pinned to ``--cpus``), loads 3 adapters and
times a 3-adapter prefill (12 sequences x 110 prompt tokens, 1 new token), the
same batch with 32 new tokens, and the base model's prefill. Prints a table and
writes JSON. ~8 min on the dev machine.

    python scripts/bench_cpu_lora.py [--cpus 0] [--out docs/results/cpu_lora.json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from areal_marlaas.adapters import init_lora_adapter
from areal_marlaas.model_prep import prepare_default_model
from areal_marlaas.rollout.server import (
    MultiLoRAvLLMConfig,
    RolloutServerConfig,
    VLLMServer,
)

CONFIGS = [  # (label, plugin on, dtype)
    ("vllm-ops bf16", False, "bfloat16"),
    ("plugin bf16", True, "bfloat16"),
    ("plugin fp32", True, "float32"),
]
PROMPT = list(range(2000, 2110))  # 110 token ids


def measure(
    model: Path, adapters: list[Path], plugin: bool, dtype: str, cpus: str, log: Path
):
    vllm = MultiLoRAvLLMConfig(
        max_loras=4, max_cpu_loras=16, max_lora_rank=8, max_model_len=1024, dtype=dtype
    )
    srv = VLLMServer(
        str(model),
        vllm,
        RolloutServerConfig(
            cpu_kvcache_space_gib=2, cpu_affinity=cpus, cpu_grouped_lora=plugin
        ),
        log,
    )
    srv.start()
    base = f"http://{srv.address}"

    def generate(name: str, tokens: int) -> None:
        body = {"model": name, "prompt": [PROMPT], "n": 4, "max_tokens": tokens}
        r = httpx.post(
            f"{base}/v1/completions", json={**body, "ignore_eos": True}, timeout=1800
        )
        r.raise_for_status()

    def batch(names: list[str], tokens: int) -> float:
        t = time.time()
        with ThreadPoolExecutor(len(names)) as ex:
            list(ex.map(lambda n: generate(n, tokens), names))
        return round(time.time() - t, 2)

    try:
        names = []
        for i, a in enumerate(adapters):
            names.append(f"t{i}")
            r = httpx.post(
                f"{base}/v1/load_lora_adapter",
                json={"lora_name": names[-1], "lora_path": str(a)},
                timeout=120,
            )
            r.raise_for_status()
        generate(names[0], 1)  # warm-up
        return {
            "lora_prefill_s": batch(names, 1),
            "lora_prefill_plus_32_s": batch(names, 32),
            "base_prefill_s": batch([str(model)] * 3, 1),
        }
    finally:
        srv.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpus", default="0", help="cores the server is pinned to")
    ap.add_argument(
        "--out",
        default="runs/cpu_lora.json",
        help="JSON of the results (runs/ is ignored: copy one to docs/results/)",
    )
    args = ap.parse_args()
    model = prepare_default_model()
    work = Path(tempfile.mkdtemp(prefix="marlaas-cpu-lora-"))
    adapters = [
        init_lora_adapter(model, work / f"a{i}", rank=8, seed=i, b_init_std=0.02)
        for i in range(3)
    ]
    rows = []
    for label, plugin, dtype in CONFIGS:
        print(f"[cpu-lora] {label} ...", flush=True)
        res = measure(model, adapters, plugin, dtype, args.cpus, work / f"{label}.log")
        rows.append({"config": label, "plugin": plugin, "dtype": dtype, **res})
    cols = ["config", "lora_prefill_s", "lora_prefill_plus_32_s", "base_prefill_s"]
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(str(r[c]) for c in cols))
    shape = "3 adapters x 4 samples, 110 prompt tokens; +32 new tokens"
    Path(args.out).write_text(
        json.dumps({"workload": shape, "cpus": args.cpus, "runs": rows}, indent=1)
    )
    print(f"[cpu-lora] wrote {args.out}")


if __name__ == "__main__":
    main()
