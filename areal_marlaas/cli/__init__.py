"""The ``marlaas`` command: one argparse tree, one module per command group
(``run``: check, train, serve, rollout, service; ``bench``: bench, bench-*;
``simulate``: simulate, report; ``tools``: prepare-model, make-tiny-model,
config-docs, search-server).

Building the tree imports nothing heavy; each handler imports AReaL, torch and
the rest after parsing, so ``marlaas <cmd> --help`` is instant and quiet."""

from __future__ import annotations

import argparse
import sys

from areal_marlaas.cli import bench, run, simulate, tools
from areal_marlaas.errors import ConfigError

DESCRIPTION = (
    "Multi-tenant asynchronous RL fine-tuning on AReaL: many LoRA tasks, one base "
    "model, one multi-LoRA vLLM server. `marlaas <command> --help` for each."
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="marlaas", description=DESCRIPTION)
    sub = parser.add_subparsers(
        dest="marlaas_command", required=True, metavar="COMMAND", title="commands"
    )
    run.add_commands(sub)
    bench.add_commands(sub)
    simulate.add_commands(sub)
    tools.add_commands(sub)
    return parser


def _parse(argv: list[str]) -> argparse.Namespace:
    args, extras = build_parser().parse_known_args(argv)
    # Config commands take hydra-style overrides anywhere on the line: argparse
    # leaves those after a flag to the extras.
    takes_overrides = hasattr(args, "overrides")
    overrides = [*args.overrides, *extras] if takes_overrides else extras
    unknown = [a for a in overrides if a.startswith("-")] if takes_overrides else extras
    if unknown:
        args.command_parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if takes_overrides:
        args.overrides = overrides
    return args


def main(argv: list[str] | None = None) -> int:
    """Runs one command; returns its exit code (usage errors and bad config:
    the message on stderr, 2)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = _parse(argv)
        try:
            return args.handler(args)
        except ConfigError as e:
            print(f"marlaas {args.marlaas_command}: error: {e}", file=sys.stderr)
            return 2
    except SystemExit as e:
        # argparse's exits (--help: 0, a usage error: 2) as the return value, so
        # callers in the same process get the code too.
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        raise
