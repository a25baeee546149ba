"""One GRPO train step of the multi-LoRA engine, timed per attention path.

Each configuration runs in its own process (a clean allocator, thread pool and
compile cache), ``rounds`` times, interleaved so drift hits every path alike.
A process loads the model, adds one task, takes one warm-up step (reported on
its own: it holds one-off costs such as compiling), then ``steps`` timed steps
on fresh on-policy batches, then one more step under torch's FLOP counter. The
achieved rate (counted FLOPs / step time) is put beside the fp32 GEMM rate
measured in the same process with the same threads.

Paths (``VARIANTS``): ``engine`` is the engine now: ``packed`` plus the audit
read from the update's own forward, the LM head on the loss's rows only, and a
process that keeps the pages it frees (``train/heap.py``, as trainer workers
start); ``engine_glibc_heap`` is the same with glibc's malloc defaults (the
engine before the heap setting); the older paths all ran on glibc's defaults.
``packed`` is the CPU attention path alone (per-sequence causal sdpa, no page
padding, AReaL's helpers eager, a separate audit forward, the full LM head), the
engine from d251ea2 until the audit moved; ``masked`` is AReaL's own sdpa path
(one block-diagonal mask over the pack, micro-batches padded to 256-token
pages), the engine before d251ea2; ``masked_compiled`` also compiles AReaL's
helpers with inductor, as before d33b705 (the code issue 17 was filed on).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from areal_marlaas.train.heap import KEEP_ENV

_NOW = {
    "packed_attention": True,
    "fused_audit": True,
    "lm_head_rows": True,
    "compile": False,
}
_OLD = {"fused_audit": False, "lm_head_rows": False, "keep_pages": False}
VARIANTS: dict[str, dict[str, Any]] = {
    "engine": {**_NOW, "keep_pages": True},
    "engine_glibc_heap": {**_NOW, "keep_pages": False},
    "packed": {"packed_attention": True, **_OLD, "compile": False},
    "masked": {"packed_attention": False, **_OLD, "compile": False},
    "masked_compiled": {"packed_attention": False, **_OLD, "compile": True},
}


def make_batch(
    groups: int,
    group_size: int,
    lens: tuple[int, int],
    prompt: int,
    version: int,
    vocab: int,
    seed: int,
) -> list[dict[str, Any]]:
    """``groups`` right-padded prompt groups of ``group_size`` sequences whose
    lengths are drawn from ``lens`` (inclusive), all from ``version``."""
    import torch

    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(groups):
        n = torch.randint(lens[0], lens[1] + 1, (group_size,), generator=g).tolist()
        width = max(n)
        ids = torch.zeros(group_size, width, dtype=torch.int32)
        attn = torch.zeros(group_size, width, dtype=torch.bool)
        for i, length in enumerate(n):
            ids[i, :length] = torch.randint(3, vocab, (length,), generator=g)
            attn[i, :length] = True
        loss = attn.int().clone()
        loss[:, :prompt] = 0
        out.append(
            {
                "input_ids": ids,
                "attention_mask": attn,
                "loss_mask": loss,
                "logprobs": -torch.rand(group_size, width, generator=g) * loss,
                "versions": torch.where(loss.bool(), version, -1).int(),
                "rewards": torch.rand(group_size, generator=g),
            }
        )
    return out


def _engine(model: str, variant: dict[str, Any]):
    from areal.api.cli_args import OptimizerConfig, PPOActorConfig
    from areal.api.io_struct import FinetuneSpec

    from areal_marlaas.config.run import _ACTOR_DEFAULTS
    from areal_marlaas.train.engine import MultiLoRAFSDPPPOActor

    class Actor(MultiLoRAFSDPPPOActor):
        packed_attention = variant["packed_attention"]
        fused_audit = variant["fused_audit"]
        lm_head_rows = variant["lm_head_rows"]

    defaults = {
        k: v for k, v in _ACTOR_DEFAULTS.items() if k not in ("optimizer", "path")
    }
    cfg = PPOActorConfig(
        **{**defaults, "experiment_name": "bench", "trial_name": "train-step"},
        path=model,
        optimizer=OptimizerConfig(lr=1e-4, weight_decay=0.0, gradient_clipping=1.0),
    )
    engine = Actor(cfg)
    engine.create_process_group()
    engine.initialize(None, FinetuneSpec(1, 1000, 4))
    return engine


def measure(opts: dict[str, Any]) -> dict[str, Any]:
    """In this process: the warm-up step, the timed steps and the FLOP count."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from areal_marlaas.bench.machine import gemm_gflops

    torch.set_num_threads(opts["threads"])
    engine = _engine(opts["model"], VARIANTS[opts["variant"]])
    vocab = engine.model.config.vocab_size
    engine.add_task(
        "t", lr=1e-4, total_steps=1000, n_samples=opts["group_size"], seed=0
    )

    def batch(i: int):
        return make_batch(
            opts["groups"],
            opts["group_size"],
            tuple(opts["lens"]),
            opts["prompt"],
            engine.slots["t"].version,
            vocab,
            seed=1000 * opts["round"] + i,
        )

    faults: list[int] = []

    def step(i: int) -> float:
        data = batch(i)
        t0 = time.perf_counter()
        result = engine.train_task("t", data)
        dt = time.perf_counter() - t0
        faults.append(result["process"]["page_faults"])
        return dt

    try:
        first = step(0)
        times = [step(i + 1) for i in range(opts["steps"])]
        data = batch(opts["steps"] + 1)
        tokens = int(sum(int(t["attention_mask"].sum()) for t in data))
        with FlopCounterMode(display=False) as counter:
            engine.train_task("t", data)
        flops = counter.get_total_flops()
    finally:
        engine.destroy()
    gemm = gemm_gflops(opts["threads"])
    step_s = statistics.mean(times)
    return {
        "variant": opts["variant"],
        "round": opts["round"],
        "first_step_s": first,
        "step_s": times,
        # Minor page faults per timed step: fresh pages the allocator touched.
        "page_faults": faults[1:],
        "tokens": tokens,
        "flops": flops,
        "achieved_gflops": flops / 1e9 / step_s,
        "gemm_gflops": gemm,
    }


def run_round(opts: dict[str, Any], out: Path) -> dict[str, Any]:
    """One variant in a fresh process (its environment picks eager or compiled)."""
    env = dict(os.environ)
    env.update(
        WORLD_SIZE="1",
        RANK="0",
        LOCAL_RANK="0",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(opts["port"]),
        OMP_NUM_THREADS=str(opts["threads"]),
        MKL_NUM_THREADS=str(opts["threads"]),
        TORCHDYNAMO_DISABLE="0" if VARIANTS[opts["variant"]]["compile"] else "1",
    )
    for key in KEEP_ENV:  # glibc reads them when the process starts
        env.pop(key, None)
    if VARIANTS[opts["variant"]]["keep_pages"]:
        env.update(KEEP_ENV)
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "areal_marlaas.bench.train_step", json.dumps(opts)]
    with open(out.with_suffix(".log"), "w") as log:
        subprocess.run(cmd, env=env, check=True, stdout=log, stderr=subprocess.STDOUT)
    return json.loads(out.read_text())


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for variant in VARIANTS:
        mine = [r for r in runs if r["variant"] == variant]
        if not mine:
            continue
        step = [statistics.mean(r["step_s"]) for r in mine]
        first = [r["first_step_s"] for r in mine]
        rate = [r["achieved_gflops"] for r in mine]
        gemm = [r["gemm_gflops"] for r in mine]
        faults = [
            statistics.mean(r["page_faults"]) for r in mine if r.get("page_faults")
        ]

        def sd(xs):
            return statistics.stdev(xs) if len(xs) > 1 else 0.0

        rows.append(
            {
                "variant": variant,
                "repeats": len(mine),
                "step_s_mean": statistics.mean(step),
                "step_s_sd": sd(step),
                "first_step_s_mean": statistics.mean(first),
                "first_step_s_sd": sd(first),
                "tokens": mine[0]["tokens"],
                "gflop_per_step": mine[0]["flops"] / 1e9,
                "achieved_gflops_mean": statistics.mean(rate),
                "achieved_gflops_sd": sd(rate),
                "gemm_gflops_mean": statistics.mean(gemm),
                "share_of_gemm": statistics.mean(rate) / statistics.mean(gemm),
                "page_faults_mean": statistics.mean(faults) if faults else None,
            }
        )
    base = {r["variant"]: r["step_s_mean"] for r in rows}
    for r in rows:
        r["speedup_vs"] = {
            v: s / r["step_s_mean"] for v, s in base.items() if v != r["variant"]
        }
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| path | repeats | step s (mean +- sd) | first step s | tokens | GFLOP/step "
        "| achieved GFLOP/s | GEMM GFLOP/s | share of GEMM | page faults/step |"
    )
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        faults = r.get("page_faults_mean")
        lines.append(
            f"| {r['variant']} | {r['repeats']} | {r['step_s_mean']:.2f} +- "
            f"{r['step_s_sd']:.2f} | {r['first_step_s_mean']:.1f} +- "
            f"{r['first_step_s_sd']:.1f} | {r['tokens']} | {r['gflop_per_step']:.0f} "
            f"| {r['achieved_gflops_mean']:.1f} +- {r['achieved_gflops_sd']:.1f} | "
            f"{r['gemm_gflops_mean']:.1f} | {r['share_of_gemm']:.0%} | "
            f"{'-' if faults is None else f'{faults:,.0f}'} |"
        )
    return "\n".join(lines)


def bench(opts: dict[str, Any], out: Path, variants: list[str], rounds: int):
    from areal.utils.network import find_free_ports

    from areal_marlaas.bench.machine import cpu_facts

    runs = []
    for rnd in range(rounds):
        for variant in variants:
            one = {**opts, "variant": variant, "round": rnd}
            one["port"] = find_free_ports(1)[0]
            one["out"] = str(out / "runs" / f"{variant}-{rnd}.json")
            print(f"[train-step] round {rnd + 1}/{rounds}: {variant}", flush=True)
            runs.append(run_round(one, Path(one["out"])))
    rows = summarize(runs)
    # The model by its folder name: the JSON is committed, a machine path is not.
    portable = {**opts, "model": Path(opts["model"]).name}
    result = {"machine": cpu_facts(), "options": portable, "rows": rows, "runs": runs}
    (out / "train_step.json").write_text(json.dumps(result, indent=2))
    (out / "train_step.md").write_text(format_table(rows) + "\n")
    return result


if __name__ == "__main__":
    opts = json.loads(sys.argv[1])
    result = measure(opts)
    Path(opts["out"]).write_text(json.dumps(result))
