"""``marlaas bench``, ``bench-service``, ``bench-rollout``, ``bench-learning`` and
``bench-train-step``: the benchmarks (docs/bench.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from areal_marlaas.cli.args import (
    RUNS_DIR,
    add_command,
    add_config_args,
    comma_list,
    config_argv,
    fail,
)


def _terminate_on_sigterm() -> None:
    import signal

    def terminate(signum, frame):
        # Unwind, so the server and the running trainer (own sessions) are stopped.
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminate)


def _bench(args: argparse.Namespace) -> int:
    from areal_marlaas.bench.report import format_result
    from areal_marlaas.bench.run import Bench, load_bench_config

    _terminate_on_sigterm()
    bench, cfg, base_yaml, train_args = load_bench_config(config_argv(args))
    result = Bench(bench, cfg, base_yaml, train_args).run()
    for r in result["runs"]:
        print(format_result(r))
    failed = [r["label"] for r in result["runs"] if r["status"] != "ok"]
    if failed:
        print(f"failed runs: {failed}")
    return 1 if failed and len(failed) == len(result["runs"]) else 0


def _bench_service(args: argparse.Namespace) -> int:
    from areal_marlaas.bench.service_bench import (
        ServiceBench,
        format_markdown,
        load_service_bench,
    )

    _terminate_on_sigterm()
    cfg, base_yaml, overrides = load_service_bench(config_argv(args))
    result = ServiceBench(cfg, base_yaml, overrides).run()
    print(format_markdown(result))
    print(f"wrote {cfg.load.out}/bench_service.json")
    failed = [r["label"] for r in result["runs"] if r["status"] != "ok"]
    if failed:
        print(f"failed runs: {failed}")
    return 1 if failed else 0


def _bench_rollout(args: argparse.Namespace) -> int:
    from areal_marlaas.bench.rollout import bench_rollout, print_table, write_json
    from areal_marlaas.config import load_config

    cfg, _ = load_config(config_argv(args))
    result = bench_rollout(cfg, args.max_new_tokens, args.repeats)
    rows = [
        {"mode": mode, **run, "adapters": len(run["adapters"])}
        for mode, data in result["modes"].items()
        for run in data["runs"]
    ]
    print_table(
        f"rollout throughput, server start {result['server_start_s'] or 0:.1f}s",
        rows,
        ["mode", "adapters", "sequences", "failed", "tokens", "wall_s", "tokens_per_s"],
    )
    print(f"mixed / single tokens/s: {result['mixed_over_single']:.3f}")
    out = Path(args.out) if args.out else cfg.run_dir / "bench_rollout.json"
    write_json(out, result)
    print(f"wrote {out}")
    return 0


def _bench_learning(args: argparse.Namespace) -> int:
    import tempfile

    from omegaconf import OmegaConf, open_dict

    from areal_marlaas.bench.learning import LearningBench
    from areal_marlaas.bench.learning_report import format_markdown, format_probe
    from areal_marlaas.config import load_config
    from areal_marlaas.config.loader import compose_yaml, parse_args

    argv = config_argv(args)
    cfg, config_file = load_config(argv)
    # Every run starts from the main YAML without its tasks (given per run).
    raw = compose_yaml(config_file)
    with open_dict(raw):
        raw.pop("tasks", None)
        raw.pop("tasks_file", None)
    base = Path(tempfile.mkdtemp(prefix="marlaas-learning-")) / "train.yaml"
    OmegaConf.save(raw, base)
    bench = LearningBench(
        cfg,
        str(base),
        parse_args(argv).overrides,
        Path(args.out),
        args.seeds,
        args.steps,
        args.eval_prompts,
        args.eval_samples,
        eval_every=args.eval_every,
        target_fraction=args.target_fraction,
        command=" ".join(["marlaas", *sys.argv[1:]]),
    )
    if args.base_only:
        print(format_probe(bench.probe()))
        return 0
    print(format_markdown(bench.run()))
    return 0


def _variants(text: str) -> list[str]:
    from areal_marlaas.bench.train_step import VARIANTS

    variants = text.split(",")
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown {unknown}; choose from {list(VARIANTS)}"
        )
    return variants


def _bench_train_step(args: argparse.Namespace) -> int:
    import os

    from areal_marlaas.bench.machine import describe, machine
    from areal_marlaas.bench.train_step import bench, format_table
    from areal_marlaas.paths import default_model_path

    lo, hi = args.lens
    if not 0 < args.prompt < lo <= hi:
        fail(
            args, "--lens min must exceed --prompt (each sequence needs output tokens)"
        )
    opts = {
        "model": str(args.model or default_model_path()),
        "threads": args.threads or len(os.sched_getaffinity(0)),
        "steps": args.steps,
        "groups": args.groups,
        "group_size": args.group_size,
        "lens": [lo, hi],
        "prompt": args.prompt,
    }
    print(f"[train-step] machine: {describe(machine())}", flush=True)
    out = Path(args.out)
    result = bench(opts, out, args.variants, args.rounds)
    print(format_table(result["rows"]))
    print(f"wrote {out / 'train_step.json'}")
    return 0


def _lens(text: str) -> tuple[int, int]:
    values = comma_list(int, "min,max, e.g. 50,90")(text)
    if len(values) != 2:
        raise argparse.ArgumentTypeError(f"expected min,max, e.g. 50,90, got {text!r}")
    return values[0], values[1]


def add_commands(sub: argparse._SubParsersAction) -> None:
    for name, handler, text in (
        (
            "bench",
            _bench,
            "Every scheduling mode, ablations and a concurrency sweep on one "
            "workload (the config's bench: section)",
        ),
        (
            "bench-service",
            _bench_service,
            "Jobs arriving as a Poisson process at the async vs a FIFO service "
            "(the config's load: section)",
        ),
    ):
        p = add_command(sub, name, handler, text)
        add_config_args(p)

    text = "Tokens/s of a mixed multi-adapter batch vs a single-adapter batch"
    p = add_command(sub, "bench-rollout", _bench_rollout, text)
    p.add_argument("--repeats", type=int, default=2, help="Batches per mode")
    p.add_argument("--max-new-tokens", type=int, default=64, help="Tokens per sequence")
    p.add_argument(
        "--out", default=None, help="JSON (default: <run dir>/bench_rollout.json)"
    )
    add_config_args(p)

    text = (
        "Held-out reward curves of every task, alone (one after another) and "
        "among tenants, over seeds; gains and time to a target"
    )
    p = add_command(sub, "bench-learning", _bench_learning, text)
    p.add_argument(
        "--out",
        default=f"{RUNS_DIR}/learning",
        help="Folder of the results and the plot (default: %(default)s)",
    )
    p.add_argument(
        "--seeds",
        type=comma_list(int, "seeds, e.g. 1,2,3"),
        default="1,2,3",
        help="Seeds, e.g. 1,2,3",
    )
    p.add_argument("--steps", type=int, default=20, help="GRPO steps per task")
    p.add_argument(
        "--eval-prompts",
        type=int,
        default=64,
        help="Held-out prompts per eval (one sample each); with --base-only, "
        "training prompts per task",
    )
    p.add_argument(
        "--eval-every", type=int, default=2, help="Versions between held-out evals"
    )
    p.add_argument(
        "--target-fraction",
        type=float,
        default=0.5,
        help="Time to quality: the first time a task's held-out reward reaches "
        "its base + this fraction of its mean gain alone",
    )
    p.add_argument(
        "--eval-samples",
        type=int,
        default=4,
        help="With --base-only: samples per prompt",
    )
    p.add_argument(
        "--base-only",
        action="store_true",
        help="Only score the base model on each task's training prompts "
        "(accuracy, and the share of prompts whose samples disagree): which "
        "tasks can learn, without touching their test split",
    )
    add_config_args(p)

    p = add_command(
        sub,
        "bench-train-step",
        _bench_train_step,
        "Time one GRPO train step of the engine against the recorded reference "
        "(docs/bench.md)",
    )
    p.add_argument("--model", default=None, help="Model folder (default: SmolLM2)")
    p.add_argument("--threads", type=int, default=None, help="Default: all cores")
    p.add_argument("--rounds", type=int, default=3, help="Processes per path")
    p.add_argument("--steps", type=int, default=2, help="Timed steps per process")
    p.add_argument("--groups", type=int, default=4, help="Prompt groups per batch")
    p.add_argument("--group-size", type=int, default=4, help="Samples per group")
    p.add_argument(
        "--lens", type=_lens, default="50,90", help="Sequence lengths, min,max"
    )
    p.add_argument("--prompt", type=int, default=30, help="Prompt tokens")
    p.add_argument(
        "--variants",
        type=_variants,
        default="engine,engine_glibc_heap",
        help="Paths to time, comma-separated (default: %(default)s)",
    )
    p.add_argument(
        "--out",
        default=f"{RUNS_DIR}/train_step",
        help="Folder of the results (default: %(default)s)",
    )
