"""One GRPO train step of the multi-LoRA engine, timed, against a recorded reference.

Each configuration runs in its own process (a clean allocator, thread pool and
compile cache), ``rounds`` times, interleaved so drift hits every path alike.
A process loads the model, adds one task, takes one warm-up step (reported on
its own: it holds one-off costs such as compiling), then ``steps`` timed steps
on fresh on-policy batches, then one more step under torch's FLOP counter. The
achieved rate (counted FLOPs / step time) is put beside the fp32 GEMM rate
measured in the same process with the same threads.

Paths (``VARIANTS``): ``engine`` is the engine as trainer workers run it, in a
process that keeps the pages it frees (``train/heap.py``); ``engine_glibc_heap``
is the same engine on glibc's malloc defaults. Code the engine no longer has
is not re-run: its measured steps are recorded in ``train_step_reference.json``
(with the machine and command they came from), and each measured path's
speed-up over a recorded path is reported where the machine and the workload
are the same.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from areal_marlaas.train.heap import KEEP_ENV

REFERENCE = Path(__file__).with_name("train_step_reference.json")
# The options that make two measurements the same workload.
WORKLOAD = ("model", "threads", "groups", "group_size", "lens", "prompt")
# The machine facts (bench/machine.py's cpu_facts) that make two the same machine.
SAME_MACHINE = ("cpu", "cores_usable", "flags")


@dataclass(frozen=True)
class Variant:
    """One measured path: the current engine in a process set up one way."""

    keep_pages: bool  # the heap keeps freed pages (keep_freed_pages)
    about: str


VARIANTS: dict[str, Variant] = {
    "engine": Variant(True, "the engine, its process keeping freed pages"),
    "engine_glibc_heap": Variant(False, "the engine on glibc's malloc defaults"),
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


def _engine(model: str):
    from areal.api.cli_args import OptimizerConfig, PPOActorConfig
    from areal.api.io_struct import FinetuneSpec

    from areal_marlaas.config.run import _ACTOR_DEFAULTS
    from areal_marlaas.train.engine import MultiLoRAFSDPPPOActor

    defaults = {
        k: v for k, v in _ACTOR_DEFAULTS.items() if k not in ("optimizer", "path")
    }
    cfg = PPOActorConfig(
        **{**defaults, "experiment_name": "bench", "trial_name": "train-step"},
        path=model,
        optimizer=OptimizerConfig(lr=1e-4, weight_decay=0.0, gradient_clipping=1.0),
    )
    engine = MultiLoRAFSDPPPOActor(cfg)
    engine.create_process_group()
    engine.initialize(None, FinetuneSpec(1, 1000, 4))
    return engine


def measure(opts: dict[str, Any]) -> dict[str, Any]:
    """In this process: the warm-up step, the timed steps and the FLOP count."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from areal_marlaas.bench.machine import gemm_gflops

    torch.set_num_threads(opts["threads"])
    engine = _engine(opts["model"])
    # An HF model: nn.Module's stub types its attributes as Tensor | Module.
    model_config: Any = engine.model.config
    vocab: int = model_config.vocab_size
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
    """One variant in a fresh process (its environment sets up its heap)."""
    env = dict(os.environ)
    env.update(
        WORLD_SIZE="1",
        RANK="0",
        LOCAL_RANK="0",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(opts["port"]),
        OMP_NUM_THREADS=str(opts["threads"]),
        MKL_NUM_THREADS=str(opts["threads"]),
        TORCHDYNAMO_DISABLE="1",  # AReaL's helpers eager, as trainers run them
    )
    for key in KEEP_ENV:  # glibc reads them when the process starts
        env.pop(key, None)
    if VARIANTS[opts["variant"]].keep_pages:
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


def load_reference(path: Path = REFERENCE) -> dict[str, Any]:
    """The recorded train steps of code the engine no longer has."""
    return json.loads(path.read_text())


def comparable(session: dict[str, Any], machine: dict[str, Any], options) -> bool:
    """Whether a recorded session ran on this kind of machine and workload."""
    return all(session["machine"].get(k) == machine.get(k) for k in SAME_MACHINE) and (
        all(session["options"].get(k) == options.get(k) for k in WORKLOAD)
    )


def compare(
    rows: list[dict[str, Any]],
    reference: dict[str, Any],
    machine: dict[str, Any],
    options: dict[str, Any],
) -> None:
    """Each row's ``vs_reference``: its speed-up over every recorded path of a
    session with the same machine and workload (none elsewhere: a step time
    means nothing on another CPU or batch)."""
    sessions = [s for s in reference["sessions"] if comparable(s, machine, options)]
    for r in rows:
        r["vs_reference"] = [
            {
                "session": s["date"],
                "path": ref["path"],
                "step_s_mean": ref["step_s_mean"],
                "share_of_gemm": ref["share_of_gemm"],
                "speedup": ref["step_s_mean"] / r["step_s_mean"],
            }
            for s in sessions
            for ref in s["rows"]
        ]


def format_table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| path | repeats | step s (mean +- sd) | first step s | tokens | GFLOP/step "
        "| achieved GFLOP/s | GEMM GFLOP/s | share of GEMM | page faults/step "
        "| vs recorded (same machine, workload) |"
    )
    lines = [head, "|" + "---|" * 11]
    for r in rows:
        faults = r.get("page_faults_mean")
        versus = "; ".join(
            f"{v['path']} ({v['session']}) {v['speedup']:.2f}x"
            for v in r.get("vs_reference", [])
        )
        lines.append(
            f"| {r['variant']} | {r['repeats']} | {r['step_s_mean']:.2f} +- "
            f"{r['step_s_sd']:.2f} | {r['first_step_s_mean']:.1f} +- "
            f"{r['first_step_s_sd']:.1f} | {r['tokens']} | {r['gflop_per_step']:.0f} "
            f"| {r['achieved_gflops_mean']:.1f} +- {r['achieved_gflops_sd']:.1f} | "
            f"{r['gemm_gflops_mean']:.1f} | {r['share_of_gemm']:.0%} | "
            f"{'-' if faults is None else f'{faults:,.0f}'} | {versus or '-'} |"
        )
    return "\n".join(lines)


def format_reference(
    reference: dict[str, Any], machine: dict[str, Any], options: dict[str, Any]
) -> str:
    """The recorded paths, each session marked by whether it is compared."""
    lines = [
        f"Recorded paths ({REFERENCE.name}: each session's command and machine):",
        "",
        "| recorded | machine | path | step s (mean +- sd) | GFLOP/step "
        "| share of GEMM | same machine, workload |",
        "|" + "---|" * 7,
    ]
    for s in reference["sessions"]:
        same = "yes" if comparable(s, machine, options) else "no"
        for ref in s["rows"]:
            lines.append(
                f"| {s['date']} | {s['machine']['cpu']}, "
                f"{s['machine']['cores_usable']} cores | {ref['path']} | "
                f"{ref['step_s_mean']:.2f} +- {ref['step_s_sd']:.2f} | "
                f"{ref['gflop_per_step']:.0f} | {ref['share_of_gemm']:.0%} | {same} |"
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
    machine = cpu_facts()
    # The model by its folder name: the JSON is committed, a machine path is not.
    portable = {**opts, "model": Path(opts["model"]).name}
    reference = load_reference()
    compare(rows, reference, machine, portable)
    result = {"machine": machine, "options": portable, "rows": rows, "runs": runs}
    (out / "train_step.json").write_text(json.dumps(result, indent=2))
    recorded = format_reference(reference, machine, portable)
    (out / "train_step.md").write_text(f"{format_table(rows)}\n\n{recorded}\n")
    return result


if __name__ == "__main__":
    opts = json.loads(sys.argv[1])
    result = measure(opts)
    Path(opts["out"]).write_text(json.dumps(result))
