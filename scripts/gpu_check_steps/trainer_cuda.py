"""GPU check, step ``trainer_cuda``: the plugin's FSDP trainer on CUDA, no vLLM.

Runs where a GPU has torch + AReaL + the plugin but no vLLM (e.g. an offline GPU
machine), and measures, on the device torch picks (CUDA if there is one):

* parity: packed-sequence logprobs (AReaL's packing + the plugin's mask fix, sdpa) vs
  a per-sequence HF forward, tiny Llama and Qwen3, float32 and bfloat16; plus stock
  AReaL's actor on Qwen3 as the control (it attends across sequences on sdpa).
* slot_swap: task A's LoRA weights and AdamW state are bitwise unchanged after task
  B trains on the same engine; the time of a ``switch_task`` (weights in/out).
* step_time: one GRPO ``train_task`` on the main model, bfloat16 vs float32, for a
  quickstart-sized batch (16 sequences, ~60 prompt + ~48 generated tokens).
* trained_adapter: after those steps, the adapter saved by the engine, loaded by
  PEFT on a plain HF model (float32, one sequence at a time), gives the engine's
  logprobs; the bf16 engine with the same adapter vs that float32 reference; and how
  far the adapter moved the logprobs from the base model (the effect size).
* multi_tenant: train steps/s of 8 tasks round-robin (a slot swap before each step)
  vs the same steps of one task.
* repeatability: two tasks with the same seed trained on the same batch end with
  the same adapter (bitwise on the same device, or the max difference).

Each part is recorded as it finishes (``GPU_CHECK_RESULT``), so a step killed at its
time limit still reports what it measured. Exit 1 if a correctness check failed.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

METRICS: dict = {}
FAILED: list[str] = []
# Packed vs per-sequence in one dtype. float32: ~5e-7 on the CPU; a cross-sequence
# attention bug is ~1e-1. bfloat16 rounding alone reaches ~1e-2 on the tiny models.
PARITY_TOL = {"float32": 1e-3, "bfloat16": 6e-2}
PEFT_TOL = 1e-3  # engine (float32, packed) vs PEFT (float32, per sequence)


def save() -> None:
    path = os.environ.get("GPU_CHECK_RESULT")
    status = {"status": "failed", "reason": "; ".join(FAILED)} if FAILED else {}
    if path:
        Path(path).write_text(json.dumps({"metrics": METRICS, **status}, indent=1))


def part(name):
    """Run one part; record its metrics or its error; never stop the others."""

    def wrap(fn):
        def run(*a, **k):
            t0 = time.monotonic()
            try:
                out = fn(*a, **k)
                METRICS.setdefault(name, {})["s"] = round(time.monotonic() - t0, 2)
                return out
            except Exception as e:
                METRICS.setdefault(name, {})["error"] = (
                    f"{type(e).__name__}: {e}"[:800]
                    + "\n"
                    + traceback.format_exc()[-1500:]
                )
                FAILED.append(f"{name}: {type(e).__name__}: {str(e)[:200]}")
                print(traceback.format_exc(), flush=True)
                return None
            finally:
                save()

        return run

    return wrap


def single_rank_env() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(
        WORLD_SIZE="1",
        RANK="0",
        LOCAL_RANK="0",
        LOCAL_WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )


def sync():
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def make_engine(path, dtype, cls=None, lr=1e-3):
    from areal.api.cli_args import OptimizerConfig, PPOActorConfig
    from areal.api.io_struct import FinetuneSpec

    from areal_marlaas.train.engine import MultiLoRAFSDPPPOActor

    cfg = PPOActorConfig(
        experiment_name="gpu-check",
        trial_name="trainer",
        path=str(path),
        backend="fsdp:d1",
        attn_impl="sdpa",
        dtype=dtype,
        use_lora=True,
        lora_rank=8,
        lora_alpha=16,
        target_modules=["all-linear"],
        optimizer=OptimizerConfig(lr=lr),
        # MARLaaS's actor settings: one optimizer step per batch, no reference model.
        ppo_n_minibatches=1,
        kl_ctl=0.0,
    )
    engine = (cls or MultiLoRAFSDPPPOActor)(cfg)
    engine.create_process_group()
    engine.initialize(None, FinetuneSpec(1, 100, 2))
    return engine


def free(*engines) -> None:
    import torch

    for e in engines:
        del e
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def ragged_batch(lens, vocab, seed=0, version=0, prompt=3):
    """Right-padded sequences of different lengths, as rollouts produce them."""
    import torch

    g = torch.Generator().manual_seed(seed)
    n, width = len(lens), max(lens)
    ids = torch.zeros(n, width, dtype=torch.int32)
    attn = torch.zeros(n, width, dtype=torch.bool)
    for i, length in enumerate(lens):
        ids[i, :length] = torch.randint(3, vocab, (length,), generator=g)
        attn[i, :length] = True
    loss = attn.int().clone()
    loss[:, :prompt] = 0
    return {
        "input_ids": ids,
        "attention_mask": attn,
        "loss_mask": loss,
        "logprobs": -torch.rand(n, width, generator=g) * loss,
        "versions": torch.where(loss.bool(), version, -1).int(),
        "rewards": torch.tensor([float(i % 2) for i in range(n)]),
    }


def quickstart_batch(vocab, seed, version, n=16, prompt=60, gen=48):
    """One task's GRPO batch at quickstart size: 4 prompts x 4 samples."""
    import random

    rnd = random.Random(seed)
    lens = [prompt + rnd.randint(gen // 2, gen) for _ in range(n)]
    return [ragged_batch(lens, vocab, seed=seed, version=version, prompt=prompt)]


def per_sequence_logprobs(model, batch, device):
    """Reference: a plain forward of each sequence alone (no packing)."""
    import torch

    lens = batch["attention_mask"].sum(-1).tolist()
    ref = torch.zeros(batch["input_ids"].shape)
    with torch.no_grad():
        for i, n in enumerate(lens):
            ids = batch["input_ids"][i, :n].long().to(device)
            logp = torch.log_softmax(model(ids[None]).logits[0].float(), -1)
            ref[i, : n - 1] = logp[:-1].gather(-1, ids[1:, None])[:, 0].cpu()
    return ref, lens


def diffs(out, ref, lens):
    import torch

    d = torch.cat(
        [
            (out[i, : n - 1].float().cpu() - ref[i, : n - 1]).abs()
            for i, n in enumerate(lens)
        ]
    )
    return {
        "max_abs_diff": float(d.max()),
        "mean_abs_diff": float(d.mean()),
        "tokens": int(d.numel()),
    }


def hf_model(path, dtype, device):
    import torch
    from transformers import AutoModelForCausalLM

    dt = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    m = AutoModelForCausalLM.from_pretrained(path, dtype=dt, attn_implementation="sdpa")
    return m.to(device).eval()


@part("parity")
def parity(tiny, device):
    from areal.engine.fsdp_engine import FSDPPPOActor

    out = METRICS.setdefault("parity", {})
    batch = ragged_batch([12, 7, 20], vocab=128)
    for arch, path in tiny.items():
        for dtype in ("float32", "bfloat16"):
            engine = make_engine(path, dtype)
            engine.add_task("a", lr=1e-3, total_steps=1, n_samples=3, seed=0)
            engine.switch_task("a")  # B=0: the adapter is the identity
            (packed,) = engine.compute_logp([batch])
            ref, lens = per_sequence_logprobs(
                hf_model(path, dtype, device), batch, device
            )
            r = diffs(packed, ref, lens)
            r["tol"] = PARITY_TOL[dtype]
            r["ok"] = r["max_abs_diff"] < r["tol"]
            out[f"{arch}_{dtype}"] = r
            if not r["ok"]:
                FAILED.append(
                    f"parity {arch} {dtype}: max |diff| "
                    f"{r['max_abs_diff']:.3g} >= {r['tol']}"
                )
            free(engine)
            save()
    # Control: stock AReaL (no mask fix) on Qwen3 with sdpa.
    engine = make_engine(tiny["qwen3"], "float32", cls=FSDPPPOActor)
    (packed,) = engine.compute_logp([batch])
    ref, lens = per_sequence_logprobs(
        hf_model(tiny["qwen3"], "float32", device), batch, device
    )
    out["control_stock_areal_qwen3_float32"] = {
        **diffs(packed, ref, lens),
        "note": "stock AReaL actor, no mask fix: expected to attend across sequences",
    }
    free(engine)


def timed_steps(engine, task, vocab, steps, seed0):
    """``steps`` GRPO steps of ``task``; the first is warm-up (not in the times)."""
    import torch

    times, toks = [], 0
    for i in range(steps):
        batch = quickstart_batch(
            vocab, seed=seed0 + i, version=engine.slots[task].version
        )
        sync()
        t0 = time.perf_counter()
        engine.train_task(task, batch)
        sync()
        if i > 0:
            times.append(time.perf_counter() - t0)
            toks += int(batch[0]["attention_mask"].sum())
    r = {"steps_timed": len(times), "step_s": [round(t, 4) for t in times]}
    if times:
        r["step_s_p50"] = statistics.median(times)
        r["tokens_per_s"] = toks / sum(times)
    if torch.cuda.is_available():
        r["peak_mem_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    return r


def snapshot(engine, task):
    import torch

    w = {k: v.clone() for k, v in engine.adapter_state(task).items()}
    opt = engine.slots[task].optimizer
    o = [
        {
            k: v.detach().clone() if torch.is_tensor(v) else v
            for k, v in opt.state[p].items()
        }
        for g in opt.param_groups
        for p in g["params"]
    ]
    return w, o


def same(a, b) -> bool:
    import torch

    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if torch.is_tensor(a):
        return torch.equal(a.cpu(), b.cpu())
    return a == b


@part("step_time")
def step_time_and_swap(main, vocab, dtype, steps, swaps, engines):
    """One engine per dtype: step time; on bf16 also the slot swap checks."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    t0 = time.monotonic()
    engine = make_engine(main, dtype)
    init_s = time.monotonic() - t0
    engine.add_task("a", lr=1e-3, total_steps=100, n_samples=4, seed=1)
    r = timed_steps(engine, "a", vocab, steps, seed0=100)
    r["engine_init_s"] = round(init_s, 2)
    METRICS.setdefault("step_time", {})[dtype] = r
    engines[dtype] = engine
    save()
    if swaps:
        slot_swap(engine, vocab, swaps)


@part("slot_swap")
def slot_swap(engine, vocab, swaps):
    engine.add_task("b", lr=1e-3, total_steps=100, n_samples=4, seed=2)
    engine.switch_task("a")
    a_before = snapshot(engine, "a")
    for i in range(2):
        engine.train_task(
            "b",
            quickstart_batch(vocab, seed=200 + i, version=engine.slots["b"].version),
        )
    engine.switch_task("a")
    a_after = snapshot(engine, "a")
    isolated = same(a_before, a_after)
    times = []
    for i in range(swaps):
        sync()
        t0 = time.perf_counter()
        engine.switch_task("b" if i % 2 == 0 else "a")
        sync()
        times.append(time.perf_counter() - t0)
    n_params = sum(t.numel() for t in engine.adapter_state("a").values())
    METRICS["slot_swap"] = {
        "a_bitwise_unchanged_after_b_trained": isolated,
        "switch_ms_p50": 1e3 * statistics.median(times),
        "switch_ms_max": 1e3 * max(times),
        "swaps": swaps,
        "lora_params_per_task": n_params,
    }
    if not isolated:
        FAILED.append("slot_swap: task a changed while task b trained")


@part("trained_adapter")
def trained_adapter(main, vocab, engines, work, device):
    """The fp32 engine's trained task 'a' vs PEFT; the bf16 engine on the same
    adapter vs that reference; the adapter's effect on the logprobs."""
    from peft import PeftModel

    e32 = engines["float32"]
    path = Path(e32.save_adapter("a", work / "trained_a"))
    batch = ragged_batch([40, 25, 64, 51], vocab=vocab, seed=7)
    e32.switch_task("a")
    (mine32,) = e32.compute_logp([batch])
    base = hf_model(main, "float32", device)
    peft = PeftModel.from_pretrained(base, str(path)).to(device).eval()
    ref, lens = per_sequence_logprobs(peft, batch, device)
    r32 = diffs(mine32, ref, lens)
    with peft.disable_adapter():
        base_ref, _ = per_sequence_logprobs(peft, batch, device)
    effect = diffs(ref, base_ref, lens)
    out = {
        "engine_float32_vs_peft_float32": {
            **r32,
            "tol": PEFT_TOL,
            "ok": r32["max_abs_diff"] < PEFT_TOL,
        },
        "adapter_effect_vs_base (mean |trained - base|)": effect["mean_abs_diff"],
        "version": e32.slots["a"].version,
    }
    if not out["engine_float32_vs_peft_float32"]["ok"]:
        FAILED.append(
            f"trained_adapter: engine vs PEFT max |diff| {r32['max_abs_diff']:.3g}"
        )
    if "bfloat16" in engines:
        e16 = engines["bfloat16"]
        e16.add_task(
            "t32", lr=1e-3, total_steps=1, n_samples=4, seed=1, init_adapter=path
        )
        e16.switch_task("t32")
        (mine16,) = e16.compute_logp([batch])
        out["engine_bfloat16_vs_peft_float32"] = diffs(mine16, ref, lens)
    METRICS["trained_adapter"] = out
    del peft, base
    free()


@part("multi_tenant")
def multi_tenant(engine, vocab, tenants, rounds):
    """Train steps/s of ``tenants`` tasks round-robin (a slot swap before every
    step) vs the same number of steps of one task: the swap's cost in practice."""
    names = [f"m{i}" for i in range(tenants)]
    for i, n in enumerate(names):
        engine.add_task(n, lr=1e-3, total_steps=100, n_samples=4, seed=50 + i)
    engine.add_task("solo", lr=1e-3, total_steps=100, n_samples=4, seed=49)
    engine.train_task("solo", quickstart_batch(vocab, seed=400, version=0))  # warm

    def timed(order):
        # Same batches (seeds) in both orders, labelled with the task's version.
        sync()
        t0 = time.perf_counter()
        for i, task in enumerate(order):
            v = engine.slots[task].version
            engine.train_task(task, quickstart_batch(vocab, seed=500 + i, version=v))
        sync()
        return time.perf_counter() - t0

    multi = timed([names[i % tenants] for i in range(tenants * rounds)])
    solo = timed(["solo"] * (tenants * rounds))
    METRICS["multi_tenant"] = {
        "tenants": tenants,
        "steps": tenants * rounds,
        "round_robin_steps_per_s": tenants * rounds / multi,
        "one_task_steps_per_s": tenants * rounds / solo,
        "round_robin_over_one_task": solo / multi,
    }


@part("repeatability")
def repeatability(engines, vocab):
    import torch

    e = engines.get("float32") or next(iter(engines.values()))
    for t in ("r1", "r2"):
        e.add_task(t, lr=1e-3, total_steps=10, n_samples=4, seed=5)
        e.train_task(t, quickstart_batch(vocab, seed=300, version=0))
    a, b = e.adapter_state("r1"), e.adapter_state("r2")
    maxd = max(float((a[k].float() - b[k].float()).abs().max()) for k in a)
    METRICS["repeatability"] = {
        "same_seed_same_batch_bitwise_equal": all(torch.equal(a[k], b[k]) for k in a),
        "max_abs_diff": maxd,
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-json", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--main-model", default=None, help="override the main model")
    ap.add_argument("--quick", action="store_true", help="fewer steps (CPU testing)")
    ap.add_argument(
        "--parts", default="parity,step_time,multi_tenant,trained_adapter,repeatability"
    )
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    models = json.loads(Path(args.model_json).read_text())["metrics"]
    main_model = args.main_model or models["main"]
    parts = set(args.parts.split(","))
    single_rank_env()

    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    METRICS["device"] = {
        "device": device,
        "name": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cuda_matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "stubbed_modules": os.environ.get("GPU_CHECK_STUBBED", ""),
        "main_model": main_model,
        "main_kind": models.get("main_kind") if not args.main_model else "override",
    }
    t0 = time.monotonic()
    import areal_marlaas.train.engine  # noqa: F401  (import time is a finding too)

    METRICS["device"]["import_s"] = round(time.monotonic() - t0, 1)
    METRICS["device"]["stubbed_modules"] = os.environ.get("GPU_CHECK_STUBBED", "")
    save()
    vocab = json.loads((Path(main_model) / "config.json").read_text())["vocab_size"]
    steps, swaps = (2, 4) if args.quick else (4, 20)
    dtypes = ["float32"] if device == "cpu" else ["bfloat16", "float32"]

    if "parity" in parts:
        parity(models["tiny"], device)
    engines: dict = {}
    if "step_time" in parts or "trained_adapter" in parts:
        for dt in dtypes:
            step_time_and_swap(
                main_model, vocab, dt, steps, swaps if dt == dtypes[0] else 0, engines
            )
        METRICS.setdefault("step_time", {})["model_kind"] = METRICS["device"][
            "main_kind"
        ]
        save()
    if "multi_tenant" in parts and engines:
        multi_tenant(
            engines[dtypes[0]], vocab, 3 if args.quick else 8, 1 if args.quick else 2
        )
    if "trained_adapter" in parts and "float32" in engines:
        trained_adapter(main_model, vocab, engines, work, device)
    if "repeatability" in parts and engines:
        repeatability(engines, vocab)
    save()
    print(json.dumps(METRICS, indent=1, default=str)[:6000])
    if FAILED:
        print("FAILED: " + "; ".join(FAILED), flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
