"""GPU check, step ``logprob_agreement``: PPO's old logprobs come from vLLM, so they
must match what the trainer computes for the same tokens under the same adapter and
temperature, for an adapter that has really been trained (B != 0).

Per dtype (one subprocess each, since a process holds one FSDP process group): start
a multi-LoRA vLLM server with ``vllm.dtype=D`` and a trainer with ``actor.dtype=D``
(configs/quickstart.yaml otherwise), train one task for ``--steps`` on-policy GRPO
steps (rollout on the server -> train_task -> save -> publish, the publish timed as
the adapter hot-swap), then roll out with the trained version and compare vLLM's
tempered logprobs with the trainer's: mean and max |diff|, the untempered control
(~0.3 on the CPU), and how far the adapter moved the trainer's logprobs from the base
model's (the effect the gap is to be read against). CPU numbers
(docs/cpu_serving.md): float32 < 1e-4, bf16 server 0.035 (an untrained adapter).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TEMPERATURE = 0.7
WORKFLOW = "areal_marlaas.workflows.rlvr.MultiTaskRLVRWorkflow"
REWARD = "areal_marlaas.tasks.rewards.numeric_answer_reward_fn"


def mean_max_abs_diff(data, recomputed):
    import torch

    diffs = []
    for traj, logp in zip(data, recomputed, strict=True):
        mask = traj["loss_mask"].bool()
        # vLLM's logprob of token i sits at i; the trainer's at i - 1.
        vllm = traj["logprobs"][mask].float().cpu()
        mine = torch.roll(logp.float().cpu(), shifts=1, dims=-1)[mask]
        diffs.append((vllm - mine).abs())
    d = torch.cat(diffs)
    return float(d.mean()), float(d.max()), int(d.numel())


def one(dtype: str, work: Path, steps: int, eager: str, gpu_mem: str) -> dict:
    import torch
    from areal.api.cli_args import GenerationHyperparameters, InferenceEngineConfig
    from areal.api.io_struct import FinetuneSpec
    from areal.utils.network import find_free_ports

    from areal_marlaas.config import load_config
    from areal_marlaas.rollout.engine import MultiLoRAvLLMEngine
    from areal_marlaas.rollout.server import VLLMServer
    from areal_marlaas.tasks.arithmetic import make_arithmetic_rows
    from areal_marlaas.train.engine import MultiLoRAFSDPPPOActor

    os.environ.update(WORLD_SIZE="1", RANK="0", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
    os.environ["MASTER_PORT"] = str(find_free_ports(1)[0])
    cfg, _ = load_config(
        [
            "--config",
            str(REPO / "configs" / "quickstart.yaml"),
            f"actor.dtype={dtype}",
            f"vllm.dtype={dtype}",
            f"vllm.enforce_eager={eager}",
            f"vllm.gpu_memory_utilization={gpu_mem}",
        ]
    )
    out: dict = {"dtype": dtype, "model": cfg.actor.path}
    work.mkdir(parents=True, exist_ok=True)
    server = VLLMServer(
        cfg.actor.path, cfg.vllm, cfg.server, work / f"vllm-{dtype}.log"
    )
    t0 = time.monotonic()
    server.start()
    out["server_start_s"] = round(time.monotonic() - t0, 1)
    rollout = None
    try:
        t0 = time.monotonic()
        trainer = MultiLoRAFSDPPPOActor(cfg.actor)
        trainer.create_process_group()
        trainer.initialize(None, FinetuneSpec(1, steps + 1, 1))
        out["trainer_init_s"] = round(time.monotonic() - t0, 1)
        n = 4
        trainer.add_task(
            "lp",
            lr=1e-3,
            total_steps=steps + 1,
            n_samples=n,
            seed=3,
            temperature=TEMPERATURE,
        )
        trainer.add_task(
            "base", lr=1e-3, total_steps=1, n_samples=n, seed=3, temperature=TEMPERATURE
        )
        rollout = MultiLoRAvLLMEngine(
            InferenceEngineConfig(
                experiment_name="gpu-check",
                trial_name=f"lp-{dtype}",
                backend="vllm:d1",
                use_lora=True,
            )
        )
        rollout.initialize(addr=server.address, train_data_parallel_size=1)
        rollout.register_task("lp", 0, trainer.save_adapter("lp", work / f"{dtype}-v0"))

        def batch(seed, count, group):
            t = time.monotonic()
            trajs = rollout.rollout_task(
                make_arithmetic_rows("multiplication", count, 1, seed=seed),
                WORKFLOW,
                dict(
                    task="lp",
                    reward_fn=REWARD,
                    gconfig=GenerationHyperparameters(
                        max_new_tokens=32, temperature=TEMPERATURE
                    ),
                    tokenizer=cfg.tokenizer_path,
                ),
                group_size=group,
            )
            return trajs, time.monotonic() - t

        publish_ms, rollout_s, rewards, train_s = [], [], [], []
        for v in range(steps):
            trajs, dt = batch(seed=10 + v, count=4, group=n)
            rollout_s.append(dt)
            rewards.append(
                float(torch.cat([t["rewards"].float().flatten() for t in trajs]).mean())
            )
            t = time.monotonic()
            trainer.train_task("lp", trajs)
            path = trainer.save_adapter("lp", work / f"{dtype}-v{v + 1}")
            train_s.append(time.monotonic() - t)
            t = time.monotonic()
            rollout.publish("lp", v + 1, path)
            publish_ms.append(1e3 * (time.monotonic() - t))
        trajs, dt = batch(seed=99, count=8, group=2)
        out["eval_rollout_s"] = round(dt, 2)
        data = [{k: v for k, v in t.items() if torch.is_tensor(v)} for t in trajs]
        trainer.switch_task("lp")
        out["mean_abs_diff"], out["max_abs_diff"], out["tokens"] = mean_max_abs_diff(
            data, trainer.compute_logp(data)
        )
        trained = trainer.compute_logp(data)
        trainer.config.temperature = 1.0  # what raw, untempered logprobs would be
        if dtype == "float32":
            # tests/e2e/test_logprob_agreement.py's bound (float32 server and trainer).
            out["within_cpu_test_tolerance_1e-3"] = out["mean_abs_diff"] < 1e-3
        out["untempered_mean_abs_diff"] = mean_max_abs_diff(
            data, trainer.compute_logp(data)
        )[0]
        trainer.switch_task("base")  # B = 0: the base model at the same temperature
        base = trainer.compute_logp(data)
        eff = [
            (a - b).abs()[t["loss_mask"].bool().roll(-1, dims=-1)]
            for a, b, t in zip(trained, base, data, strict=True)
        ]
        out["adapter_effect_mean_abs"] = float(
            torch.cat([e.float().cpu() for e in eff]).mean()
        )
        out.update(
            version=steps,
            publish_ms=[round(x, 1) for x in publish_ms],
            publish_ms_p50=statistics.median(publish_ms) if publish_ms else None,
            rollout_s=[round(x, 2) for x in rollout_s],
            train_s=[round(x, 2) for x in train_s],
            reward_mean=rewards,
        )
    finally:
        if rollout is not None:
            rollout.destroy()
        server.stop()
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--work", required=True)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--eager", default="true")
    ap.add_argument("--gpu-memory-utilization", default="0.3")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    work = Path(args.work)
    if args.one:
        res = one(args.one, work, args.steps, args.eager, args.gpu_memory_utilization)
        (work / f"{args.one}.json").write_text(json.dumps(res, indent=1))
        print(json.dumps(res, indent=1))
        return 0
    metrics: dict = {}
    failed = []
    for dtype in args.dtypes.split(","):
        work.mkdir(parents=True, exist_ok=True)
        (work / f"{dtype}.json").unlink(missing_ok=True)
        argv = [
            sys.executable,
            __file__,
            "--one",
            dtype,
            "--work",
            str(work),
            "--steps",
            str(args.steps),
            "--eager",
            args.eager,
            "--gpu-memory-utilization",
            args.gpu_memory_utilization,
        ]
        r = subprocess.run(argv)
        f = work / f"{dtype}.json"
        if r.returncode == 0 and f.is_file():
            metrics[dtype] = json.loads(f.read_text())
        else:
            metrics[dtype] = {"error": f"exit {r.returncode}"}
            failed.append(f"{dtype}: exit {r.returncode}")
        result = os.environ.get("GPU_CHECK_RESULT")
        if result:
            status = {"status": "failed", "reason": "; ".join(failed)} if failed else {}
            Path(result).write_text(
                json.dumps({"metrics": metrics, **status}, indent=1)
            )
    print(json.dumps(metrics, indent=1)[:4000])
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:
        traceback.print_exc()
        sys.exit(1)
