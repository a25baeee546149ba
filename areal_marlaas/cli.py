"""The ``marlaas`` command: train, check, serve, bench, bench-*, simulate, report,
search-server, prepare-model."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _prepare_model(args: argparse.Namespace) -> int:
    from areal_marlaas.models import prepare_default_model

    print(prepare_default_model(args.out, force=args.force))
    return 0


def _make_tiny_model(args: argparse.Namespace) -> int:
    from areal_marlaas.models import make_tiny_model

    print(make_tiny_model(args.out, arch=args.arch, seed=args.seed))
    return 0


def _check(rest: list[str]) -> int:
    """Validate a config and its tasks without running anything."""
    from areal_marlaas.check import admission_plan, check_config
    from areal_marlaas.config import load_config

    cfg, config_file = load_config(rest)
    reports = check_config(cfg)
    plan = admission_plan(cfg, reports)
    print(f"{config_file}: {len(reports)} task(s)")
    print(f"{'task':<16} {'kind':<16} {'rows':>7} {'KV/batch MiB':>12}  reward_fn")
    for r in reports:
        print(
            f"{r.name:<16} {r.kind:<16} {r.rows:>7} {r.kv_bytes / 2**20:>12.1f}  "
            f"{r.reward_fn}"
        )
    budget = "unlimited" if plan.budget is None else f"{plan.budget / 2**20:.1f} MiB"
    print(
        f"mode={cfg.scheduler.mode} KV budget {budget}, "
        f"max rolling={cfg.scheduler.max_rolling or 'no cap'}"
    )
    print(f"first round admits: {', '.join(plan.admitted) or '-'}")
    for name, reason in plan.held.items():
        print(f"  held: {name} ({reason})")
    print("OK")
    return 0


def _serve(rest: list[str]) -> int:
    """Run the shared server in the foreground \
(attach trainers with server.addresses)."""
    import signal
    import threading

    from areal_marlaas.config import load_config
    from areal_marlaas.rollout.server import VLLMServer

    cfg, _ = load_config(rest)
    log = cfg.server.log_file or "vllm_server.log"
    server = VLLMServer(cfg.vllm.model, cfg.vllm, cfg.server, log)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with server:
        print(f"serving on {server.address} (log: {log}); Ctrl-C stops", flush=True)
        try:
            while server.alive() and not stop.wait(1):
                pass
        except KeyboardInterrupt:
            pass
    return 0


def _rollout(rest: list[str]) -> int:
    """One rollout batch per task on the shared multi-LoRA server (no training)."""
    from areal_marlaas.bench.rollout import print_table, rollout_once
    from areal_marlaas.config import load_config

    cfg, _ = load_config(rest)
    result = rollout_once(cfg)
    print_table(
        f"one batch per task, all tasks at once ({result['wall_s']:.1f}s, server "
        f"start {result['server_start_s'] or 0:.1f}s)",
        result["tasks"],
        [
            "task",
            "adapter",
            "trajectories",
            "failed",
            "tokens",
            "reward_mean",
            "wall_s",
        ],
    )
    return 0


def _bench_rollout(rest: list[str]) -> int:
    """Tokens/s of a mixed multi-adapter batch vs a single-adapter batch."""
    import argparse

    from areal_marlaas.bench.rollout import bench_rollout, print_table, write_json
    from areal_marlaas.config import load_config

    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--out", default=None)
    opts, rest = parser.parse_known_args(rest)
    cfg, _ = load_config(rest)
    result = bench_rollout(cfg, opts.max_new_tokens, opts.repeats)
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
    out = Path(opts.out) if opts.out else cfg.run_dir / "bench_rollout.json"
    write_json(out, result)
    print(f"wrote {out}")
    return 0


def _bench_train_step(args) -> int:
    import os

    from areal_marlaas.bench.machine import describe, machine
    from areal_marlaas.bench.train_step import VARIANTS, bench, format_table
    from areal_marlaas.paths import default_model_path

    variants = args.variants.split(",")
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        print(f"--variants: unknown {unknown}; choose from {list(VARIANTS)}")
        return 2
    lo, hi = (int(x) for x in args.lens.split(","))
    if not 0 < args.prompt < lo <= hi:
        print("--lens min must exceed --prompt (each sequence needs output tokens)")
        return 2
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
    result = bench(opts, out, variants, args.rounds)
    print(format_table(result["rows"]))
    print(f"wrote {out / 'train_step.json'}")
    return 0


def _train(rest: list[str]) -> int:
    """Train every task of the config (MARLaaS async mode)."""
    from areal_marlaas.train.heap import keep_freed_pages_if_asked

    keep_freed_pages_if_asked(rest)
    from areal_marlaas.train import screen

    if not screen.asks_verbose(rest):  # before AReaL's import-time INFO lines
        screen.quiet_console()
    from areal_marlaas.train.trainer import main as train_main

    return train_main(rest)


def _bench_learning(rest: list[str]) -> int:
    """Held-out accuracy of every task, alone and among tenants, over seeds."""
    import argparse
    import tempfile

    from omegaconf import OmegaConf, open_dict

    from areal_marlaas.bench.learning import LearningBench, format_markdown
    from areal_marlaas.config import load_config
    from areal_marlaas.config.loader import compose_yaml, parse_args

    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--out", default="docs/results/learning")
    parser.add_argument("--seeds", default="1,2,3", help="e.g. 1,2,3")
    parser.add_argument("--steps", type=int, default=20, help="GRPO steps per task")
    parser.add_argument("--eval-prompts", type=int, default=64)
    parser.add_argument("--eval-samples", type=int, default=4)
    opts, rest = parser.parse_known_args(rest)
    cfg, config_file = load_config(rest)
    args = parse_args(rest)
    # Every run starts from the main YAML without its tasks (given per run).
    raw = compose_yaml(config_file)
    with open_dict(raw):
        raw.pop("tasks", None)
        raw.pop("tasks_file", None)
    base = Path(tempfile.mkdtemp(prefix="marlaas-learning-")) / "train.yaml"
    OmegaConf.save(raw, base)
    seeds = [int(s) for s in opts.seeds.split(",") if s.strip()]
    bench = LearningBench(
        cfg,
        str(base),
        args.overrides,
        Path(opts.out),
        seeds,
        opts.steps,
        opts.eval_prompts,
        opts.eval_samples,
    )
    print(format_markdown(bench.run()))
    return 0


def _bench(rest: list[str]) -> int:
    """Every scheduling mode, ablations and a concurrency sweep on one workload."""
    import signal

    from areal_marlaas.bench.report import format_result
    from areal_marlaas.bench.run import Bench, load_bench_config

    def _terminate(signum, frame):
        # Unwind, so the server and the running trainer (own sessions) are stopped.
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _terminate)
    bench, cfg, base_yaml, train_args = load_bench_config(rest)
    result = Bench(bench, cfg, base_yaml, train_args).run()
    for r in result["runs"]:
        print(format_result(r))
    failed = [r["label"] for r in result["runs"] if r["status"] != "ok"]
    if failed:
        print(f"failed runs: {failed}")
    return 1 if failed and len(failed) == len(result["runs"]) else 0


def _bench_service(rest: list[str]) -> int:
    """Jobs arriving as a Poisson process at the async vs a FIFO service."""
    import signal

    from areal_marlaas.bench.service_bench import (
        ServiceBench,
        format_markdown,
        load_service_bench,
    )

    def _terminate(signum, frame):
        raise SystemExit(128 + signum)  # unwind: the service is stopped

    signal.signal(signal.SIGTERM, _terminate)
    cfg, base_yaml, overrides = load_service_bench(rest)
    result = ServiceBench(cfg, base_yaml, overrides).run()
    print(format_markdown(result))
    print(f"wrote {cfg.load.out}/bench_service.json")
    failed = [r["label"] for r in result["runs"] if r["status"] != "ok"]
    if failed:
        print(f"failed runs: {failed}")
    return 1 if failed else 0


def _service(rest: list[str]) -> int:
    """The job service (--config X.yaml), or its operator commands (tenant,
    admin-key, status)."""
    if rest and rest[0] in ("tenant", "admin-key", "status"):
        from areal_marlaas.service.cli import main as operator_main

        return operator_main(rest)
    from areal_marlaas.train.heap import keep_freed_pages_if_asked

    keep_freed_pages_if_asked(rest)
    from areal_marlaas.service.runner import main as service_main

    return service_main(rest)


# Commands that take `--config X.yaml [--tasks T.yaml] [key=value ...]`.
_CONFIG_COMMANDS = {
    "check": _check,
    "train": _train,
    "serve": _serve,
    "rollout": _rollout,
    "bench": _bench,
    "bench-rollout": _bench_rollout,
    "bench-learning": _bench_learning,
    "bench-service": _bench_service,
    "service": _service,
}


def _report(args: argparse.Namespace) -> int:
    from areal_marlaas.metrics.report import format_phase_stats, phase_stats

    print(format_phase_stats(phase_stats(args.run_dir)))
    return 0


def _simulate(args: argparse.Namespace) -> int:
    from areal_marlaas.sim.project import (
        format_models,
        format_projection,
        format_sim_markdown,
        format_validation,
        simulate_bench,
    )

    try:
        tenants = [int(x) for x in args.tenants.split(",") if x.strip()]
    except ValueError:
        print(f"--tenants: expected e.g. 1,32,1000, got {args.tenants!r}")
        return 2
    if not tenants or min(tenants) < 1:
        print(f"--tenants: counts must be >= 1, got {args.tenants!r}")
        return 2
    if args.rollout_devices < 1 or args.train_devices < 1:
        print("--rollout-devices and --train-devices must be >= 1")
        return 2
    kv = int(args.kv_budget_gib * 2**30) if args.kv_budget_gib else None
    fit_modes = None
    if args.fit_modes:
        from areal_marlaas.scheduler.core import MODES

        fit_modes = [m.strip() for m in args.fit_modes.split(",") if m.strip()]
        unknown = sorted(set(fit_modes) - set(MODES))
        if unknown:
            print(f"--fit-modes: unknown {unknown}; choose from {list(MODES)}")
            return 2
    try:
        env_s = [float(x) for x in args.env_s.split(",") if x.strip()]
    except ValueError:
        print(f"--env-s: expected seconds, e.g. 10,60, got {args.env_s!r}")
        return 2
    if any(e < 0 for e in env_s):
        print(f"--env-s: seconds must be >= 0, got {args.env_s!r}")
        return 2
    try:
        out = simulate_bench(
            args.bench,
            tenants,
            args.rollout_devices,
            args.train_devices,
            kv,
            args.steps,
            fit_modes,
            args.predict,
            mix=args.mix,
            env_s=env_s or None,
        )
    except (FileNotFoundError, ValueError) as e:
        print(f"marlaas simulate: error: {e}", file=sys.stderr)
        return 2
    print(format_models({p: _models(m) for p, m in out["models"].items()}))
    print("\nmeasured vs simulated (each measured configuration):")
    print(format_validation(out["validation"]))
    c = out["cluster"]
    print(
        f"\nprojection: {c['rollout_devices']} rollout device(s), "
        f"{c['train_devices']} train device(s), KV budget "
        f"{(c['kv_budget_per_device'] or 0) / 2**30:.1f} GiB per rollout device:"
    )
    print(format_projection(out["projection"]))
    dest = Path(args.out) if args.out else Path(out["bench"]) / "sim.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(out, indent=1))
    dest.with_suffix(".md").write_text(format_sim_markdown(out))
    print(f"wrote {dest} and {dest.with_suffix('.md')}")
    return 0


def _config_docs(args: argparse.Namespace) -> int:
    from areal_marlaas.config.reference import generate

    text = generate()
    if args.out:
        Path(args.out).write_text(text)
        print(f"wrote {args.out}")
    else:
        print(text, end="")
    return 0


def _search_server(args: argparse.Namespace) -> int:
    from areal_marlaas.tools.search_server import Latency, serve

    try:
        latency = Latency(args.latency_median_s, args.latency_sigma, args.latency_seed)
    except ValueError as e:
        print(f"marlaas search-server: error: {e}", file=sys.stderr)
        return 2
    if args.workers < 1:
        print("marlaas search-server: error: --workers must be >= 1", file=sys.stderr)
        return 2
    return serve(args.corpus, args.host, args.port, args.workers, latency)


def _models(d: dict):
    from areal_marlaas.sim.latency import LatencyModels

    return LatencyModels.from_dict(d)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in _CONFIG_COMMANDS:
        from areal_marlaas.config import ConfigError

        try:
            return _CONFIG_COMMANDS[argv[0]](argv[1:])
        except ConfigError as e:
            print(f"marlaas {argv[0]}: error: {e}", file=sys.stderr)
            return 2
    parser = argparse.ArgumentParser(prog="marlaas", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser(
        "prepare-model", help="Convert SmolLM2-135M-Instruct (PyPI GGUF)"
    )
    p.add_argument("--out", default=None, help="Target folder (default: the cache)")
    p.add_argument("--force", action="store_true", help="Rebuild even if present")
    p.set_defaults(fn=_prepare_model)

    for name, fn in _CONFIG_COMMANDS.items():
        sub.add_parser(
            name,
            help=(fn.__doc__ or name).splitlines()[0],
            usage=f"marlaas {name} --config X.yaml [--tasks T.yaml] [key=value ...]",
        )

    p = sub.add_parser("report", help="Time per phase and task of a run directory")
    p.add_argument("run_dir")
    p.set_defaults(fn=_report)

    p = sub.add_parser(
        "simulate", help="Fit a bench run, validate, project to many tenants"
    )
    p.add_argument("bench", help="bench.json or the folder holding it")
    p.add_argument("--tenants", default="1,32,1000", help="Tenant counts, e.g. 1,32")
    p.add_argument("--rollout-devices", type=int, default=1)
    p.add_argument("--train-devices", type=int, default=1)
    p.add_argument(
        "--kv-budget-gib",
        type=float,
        default=None,
        help="KV budget per rollout device (default: the bench server's)",
    )
    p.add_argument("--steps", type=int, default=None, help="Steps per tenant")
    p.add_argument(
        "--fit-modes",
        default=None,
        help="Fit only on these modes' runs, e.g. async; the others are then "
        "predicted out of sample (default: fit on every run)",
    )
    p.add_argument(
        "--predict",
        action="append",
        default=None,
        metavar="OTHER_BENCH",
        help="Also predict the runs of another bench (e.g. another tenant count "
        "or step count) from this bench's fit: all out of sample (repeatable)",
    )
    p.add_argument(
        "--mix",
        action="store_true",
        help="Project replicas of the bench's whole task mix (tenant i takes "
        "task i mod mix size) instead of its first task",
    )
    p.add_argument(
        "--env-s",
        default="",
        help="Sweep every projected task's tool-call seconds per batch, e.g. "
        "10,60 (default: each task's fitted time)",
    )
    p.add_argument("--out", default=None, help="JSON (default: <bench>/sim.json)")
    p.set_defaults(fn=_simulate)

    p = sub.add_parser(
        "config-docs", help="Write the configuration reference (docs/config.md)"
    )
    p.add_argument("--out", default=None, help="File (default: print it)")
    p.set_defaults(fn=_config_docs)

    p = sub.add_parser(
        "search-server", help="BM25 search over a corpus behind HTTP (docs/tasks.md)"
    )
    p.add_argument("--corpus", required=True, help="jsonl of {id, title, text}")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8100, help="0 = a free port")
    p.add_argument("--workers", type=int, default=2, help="Worker processes")
    p.add_argument(
        "--latency-median-s",
        type=float,
        default=0.0,
        help="Injected log-normal delay per request, its median (0 = none); "
        "stands in for a real web search API in benchmarks",
    )
    p.add_argument("--latency-sigma", type=float, default=0.5, help="Its shape")
    p.add_argument("--latency-seed", type=int, default=None, help="Its seed")
    p.set_defaults(fn=_search_server)

    p = sub.add_parser(
        "bench-train-step",
        help="Time one GRPO train step per attention path (docs/bench.md)",
    )
    p.add_argument("--model", default=None, help="Model folder (default: SmolLM2)")
    p.add_argument("--threads", type=int, default=None, help="Default: all cores")
    p.add_argument("--rounds", type=int, default=3, help="Processes per path")
    p.add_argument("--steps", type=int, default=2, help="Timed steps per process")
    p.add_argument("--groups", type=int, default=4, help="Prompt groups per batch")
    p.add_argument("--group-size", type=int, default=4, help="Samples per group")
    p.add_argument("--lens", default="50,90", help="Sequence lengths, min,max")
    p.add_argument("--prompt", type=int, default=30, help="Prompt tokens")
    p.add_argument("--variants", default="engine,engine_glibc_heap,masked_compiled")
    p.add_argument("--out", default="docs/results/train_step")
    p.set_defaults(fn=_bench_train_step)

    p = sub.add_parser("make-tiny-model", help="Write a tiny random model for tests")
    p.add_argument("--out", required=True)
    p.add_argument("--arch", choices=["llama", "qwen3"], default="llama")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(fn=_make_tiny_model)

    args = parser.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
