"""``marlaas rollout`` and ``marlaas bench-rollout``: the multi-LoRA rollout path on
its own (no training), for the quickstart and for measuring cross-adapter batching.

``rollout`` registers each task's v0 adapter and runs one batch per task, all tasks
at once, printing per-task rewards. ``bench-rollout`` compares, in one run, a mixed
batch (every task's adapter in the same server batch) with a single-adapter batch of
the same size, and writes JSON.
"""

from __future__ import annotations

import json
import random
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from areal.utils import logging

from areal_marlaas.adapters import adapter_name, init_lora_adapter
from areal_marlaas.config import MARLaaSConfig, TaskSpec
from areal_marlaas.fmt import fmt
from areal_marlaas.rollout.engine import MultiLoRAvLLMEngine
from areal_marlaas.rollout.session import RolloutSession
from areal_marlaas.rundir.writer import RunStore
from areal_marlaas.tasks import load_task_rows
from areal_marlaas.trajectory import failure_reason
from areal_marlaas.workflows import task_workflow

logger = logging.getLogger("MARLaaSRolloutBench")


@dataclass
class BatchResult:
    task: str
    adapter: str
    trajectories: int
    failed: int
    tokens: int
    reward_mean: float
    wall_s: float


def make_v0_adapters(cfg: MARLaaSConfig, root: Path) -> dict[str, Path]:
    """Every task starts from B=0 (the base model), its A seeded by the task seed."""
    store = RunStore(root, fresh=None)
    out = {}
    for task in cfg.tasks:
        path = store.adapter_dir(task.name, 0)
        if not (path / "adapter_config.json").exists():
            init_lora_adapter(
                cfg.actor.path,
                path,
                rank=cfg.actor.lora_rank,
                alpha=cfg.actor.lora_alpha,
                target_modules=list(cfg.actor.target_modules),
                seed=task.seed,
            )
        out[task.name] = path
    return out


def sample_rows(task: TaskSpec, rows: list[dict], n: int, step: int = 0) -> list[dict]:
    rng = random.Random(f"{task.seed}:{step}")
    return rng.sample(rows, min(n, len(rows)))


def run_batches(
    engine: MultiLoRAvLLMEngine,
    tokenizer: str,
    jobs: list[tuple[TaskSpec, list[dict]]],
) -> list[BatchResult]:
    """Run every (task, rows) job at the same time; each waits only for its own."""
    results: list[BatchResult | None] = [None] * len(jobs)
    errors: list[BaseException] = []

    def one(i: int, task: TaskSpec, rows: list[dict]) -> None:
        try:
            workflow, kwargs = task_workflow(task, tokenizer)
            t0 = time.monotonic()
            trajs = engine.rollout_task(
                rows, workflow, kwargs, group_size=task.n_samples
            )
            wall = time.monotonic() - t0
            ok = [t for t in trajs if t is not None and failure_reason(t) is None]
            tokens = sum(int(t["loss_mask"].sum()) for t in ok)
            rewards = [float(r) for t in ok for r in t["rewards"]]
            results[i] = BatchResult(
                task=task.name,
                adapter=adapter_name(task.name, engine.task_version(task.name)),
                trajectories=sum(t["rewards"].shape[0] for t in ok),
                failed=len(trajs) - len(ok),
                tokens=tokens,
                reward_mean=sum(rewards) / max(len(rewards), 1),
                wall_s=wall,
            )
        except BaseException as e:  # reported by the caller
            errors.append(e)

    threads = [
        threading.Thread(target=one, args=(i, *job)) for i, job in enumerate(jobs)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return [r for r in results if r is not None]


def rollout_once(cfg: MARLaaSConfig) -> dict:
    """Quickstart: one concurrent batch per task on v0 adapters."""
    root = cfg.run_dir
    adapters = make_v0_adapters(cfg, root)
    with RolloutSession(cfg, root) as session:
        engine = session.engine
        assert engine is not None  # started on entering
        for name, path in adapters.items():
            engine.register_task(name, 0, path)
        jobs = [(t, sample_rows(t, load_task_rows(t), t.batch_size)) for t in cfg.tasks]
        t0 = time.monotonic()
        results = run_batches(engine, cfg.tokenizer_path, jobs)
        wall = time.monotonic() - t0
    return {
        "server_start_s": session.server_start_s,
        "wall_s": wall,
        "tasks": [asdict(r) for r in results],
    }


def bench_rollout(cfg: MARLaaSConfig, max_new_tokens: int, repeats: int) -> dict:
    """Mixed (all tasks' adapters) vs single-adapter batches of equal size.

    Every task's v0 adapter has B=0 (it equals the base model, as at the start of
    training), so both modes sample from the same distribution and produce
    comparable lengths, while every request still runs the LoRA kernels.
    """
    root = cfg.run_dir
    adapters = make_v0_adapters(cfg, root)
    tasks = [replace(t, max_new_tokens=max_new_tokens) for t in cfg.tasks]
    rows = {t.name: load_task_rows(t) for t in tasks}
    with RolloutSession(cfg, root) as session:
        engine = session.engine
        assert engine is not None  # started on entering
        for name, path in adapters.items():
            engine.register_task(name, 0, path)
        modes: dict[str, list[dict]] = {"mixed": [], "single": []}
        for rep in range(repeats):
            mixed = [
                (t, sample_rows(t, rows[t.name], t.batch_size, rep)) for t in tasks
            ]
            # Same prompts, same count, all served by the first task's adapter.
            first = tasks[0]
            single = [(first, r) for _, r in mixed]
            for mode, jobs in (("mixed", mixed), ("single", single)):
                t0 = time.monotonic()
                res = run_batches(engine, cfg.tokenizer_path, jobs)
                wall = time.monotonic() - t0
                tokens = sum(r.tokens for r in res)
                modes[mode].append(
                    {
                        "wall_s": wall,
                        "tokens": tokens,
                        "sequences": sum(r.trajectories for r in res),
                        "failed": sum(r.failed for r in res),
                        "adapters": sorted({r.adapter for r in res}),
                        "tokens_per_s": tokens / wall,
                    }
                )
                logger.info(f"{mode} rep {rep}: {tokens} tokens in {wall:.1f}s")
    summary = {
        mode: {
            "tokens_per_s_mean": sum(r["tokens_per_s"] for r in runs) / len(runs),
            "runs": runs,
        }
        for mode, runs in modes.items()
    }
    return {
        "machine": _machine(),
        "model": cfg.actor.path,
        "server_start_s": session.server_start_s,
        "max_new_tokens": max_new_tokens,
        "modes": summary,
        "mixed_over_single": summary["mixed"]["tokens_per_s_mean"]
        / summary["single"]["tokens_per_s_mean"],
    }


def _machine() -> dict:
    import os
    import platform

    return {
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "python": platform.python_version(),
    }


def print_table(title: str, rows: list[dict], cols: list[str]) -> None:
    print(title)
    print("  ".join(f"{c:>14}" for c in cols))
    for r in rows:
        print("  ".join(f"{fmt(r.get(c), 3):>14}" for c in cols))


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2))
