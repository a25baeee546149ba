"""``marlaas check``, ``train``, ``serve``, ``rollout`` and ``service`` (with its
operator commands): the commands that run a config."""

from __future__ import annotations

import argparse

from areal_marlaas.cli.args import (
    CommandOrOverrides,
    add_command,
    add_config_args,
    config_argv,
    fail,
)


def _check(args: argparse.Namespace) -> int:
    from areal_marlaas.check import admission_plan, check_config
    from areal_marlaas.config import load_config

    cfg, config_file = load_config(config_argv(args))
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


def _train(args: argparse.Namespace) -> int:
    argv = config_argv(args)
    # Before torch and AReaL are imported: their threads would each keep an arena.
    from areal_marlaas.train.heap import keep_freed_pages_if_asked

    keep_freed_pages_if_asked(argv)
    from areal_marlaas.train import screen

    if not screen.asks_verbose(argv):  # before AReaL's import-time INFO lines
        screen.quiet_console()
    from areal_marlaas.train.trainer import main as train_main

    return train_main(argv)


def _serve(args: argparse.Namespace) -> int:
    import signal
    import threading

    from areal_marlaas.config import load_config
    from areal_marlaas.rollout.server import VLLMServer

    cfg, _ = load_config(config_argv(args))
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


def _rollout(args: argparse.Namespace) -> int:
    from areal_marlaas.bench.rollout import print_table, rollout_once
    from areal_marlaas.config import load_config

    cfg, _ = load_config(config_argv(args))
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


def _service(args: argparse.Namespace) -> int:
    if args.config is None:
        fail(args, "the following arguments are required: --config")
    argv = config_argv(args)
    from areal_marlaas.train.heap import keep_freed_pages_if_asked

    keep_freed_pages_if_asked(argv)
    from areal_marlaas.train import screen

    if not screen.asks_verbose(argv):  # before AReaL's import-time INFO lines
        screen.quiet_console()
    from areal_marlaas.service.runner import main as service_main

    return service_main(argv)


def _service_operator(args: argparse.Namespace) -> int:
    from areal_marlaas.service.cli import run

    return run(args, args.overrides)


def add_commands(sub: argparse._SubParsersAction) -> None:
    for name, handler, text in (
        ("check", _check, "Validate a config and its tasks without running anything"),
        ("train", _train, "Train every task of the config (MARLaaS async mode)"),
        (
            "serve",
            _serve,
            "Run the shared vLLM server in the foreground (attach trainers with "
            "server.addresses)",
        ),
        (
            "rollout",
            _rollout,
            "One rollout batch per task on the shared multi-LoRA server (no training)",
        ),
    ):
        p = add_command(sub, name, handler, text)
        add_config_args(p)

    p = add_command(
        sub,
        "service",
        _service,
        "The fine-tuning jobs service (--config X.yaml), or its operator commands",
        description="Serve the fine-tuning jobs API until SIGTERM or Ctrl-C "
        "(--config X.yaml [key=value ...]), or manage its tenants and keys (the "
        "subcommands; --config and overrides name the store).",
        usage="marlaas service --config X.yaml [--resume] [--verbose] [key=value ...]\n"
        "       marlaas service {tenant,admin-key,status} ... [--config X.yaml] "
        "[key=value ...]",
    )
    # The overrides are taken by the subcommands action, not a positional: it
    # would swallow the subcommand's name.
    p.add_argument("--config", default=None, metavar="X.yaml", help="Main YAML")
    p.add_argument("--tasks", default=None, help=argparse.SUPPRESS)
    p.add_argument(
        "--resume", action="store_true", help="Same as the override resume=true"
    )
    p.add_argument(
        "--verbose",
        action="store_true",
        help="AReaL's logs on the screen too (same as verbose=true)",
    )
    p.set_defaults(overrides=[])
    commands = p.add_subparsers(
        dest="command",
        action=CommandOrOverrides,
        metavar="{tenant,admin-key,status}",
        prog="marlaas service",
        title="operator commands",
    )
    from areal_marlaas.service.cli import add_commands as add_operator_commands

    add_operator_commands(commands, handler=_service_operator, overrides=[])
