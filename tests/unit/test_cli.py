"""The ``marlaas`` command line: one argparse tree; ``--help`` on every command
exits 0, quietly and without importing AReaL; usage errors go to stderr with exit
code 2; config overrides are taken anywhere on the line."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest

from areal_marlaas.cli import _parse, build_parser
from areal_marlaas.cli.args import config_argv
from tests.support.paths import REPO

CONSOLE = Path(sys.executable).with_name("marlaas")
MODULE = [sys.executable, "-m", "areal_marlaas.cli"]
MARLAAS = [str(CONSOLE)] if CONSOLE.exists() else MODULE

EXPECTED = {
    ("check",),
    ("train",),
    ("serve",),
    ("rollout",),
    ("service",),
    ("service", "tenant"),
    ("service", "tenant", "add"),
    ("service", "tenant", "key"),
    ("service", "tenant", "weight"),
    ("service", "tenant", "list"),
    ("service", "tenant", "revoke"),
    ("service", "tenant", "webhook"),
    ("service", "tenant", "webhook", "add"),
    ("service", "tenant", "webhook", "list"),
    ("service", "tenant", "webhook", "remove"),
    ("service", "tenant", "webhook", "deliveries"),
    ("service", "admin-key"),
    ("service", "status"),
    ("bench",),
    ("bench-service",),
    ("bench-rollout",),
    ("bench-learning",),
    ("bench-train-step",),
    ("report",),
    ("simulate",),
    ("simulate-service",),
    ("prepare-model",),
    ("make-tiny-model",),
    ("config-docs",),
    ("search-server",),
}
# Imported by a command's handler only: never while parsing.
HEAVY = ("areal", "torch", "hydra", "omegaconf", "vllm", "transformers")


def walk(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(command path, parser) of every command in the tree."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action._name_parser_map.items():
                yield (*path, name), sub
                yield from walk(sub, (*path, name))


COMMANDS = sorted(path for path, _ in walk(build_parser()))


def marlaas(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*MARLAAS, *argv], capture_output=True, text=True, timeout=60, cwd=REPO
    )


def test_the_tree_holds_every_command():
    assert set(COMMANDS) == EXPECTED


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_help_exits_0_with_usage_on_stdout_and_no_logs(command):
    r = marlaas(*command, "--help")

    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"usage: marlaas {' '.join(command)}"), r.stdout
    assert r.stderr == ""
    assert "(AReaL)" not in r.stdout and " INFO" not in r.stdout


def test_top_level_help_lists_every_command():
    r = marlaas("--help")

    assert r.returncode == 0 and r.stderr == ""
    for (name,) in (c for c in EXPECTED if len(c) == 1):
        assert f"\n    {name} " in r.stdout or f"\n    {name}\n" in r.stdout, name


def test_help_imports_nothing_heavy():
    """Every command's --help in one process: AReaL, torch, hydra stay unloaded
    (their import alone takes seconds and prints AReaL's INFO lines)."""
    code = (
        "import contextlib, io, sys\n"
        "from areal_marlaas.cli import main\n"
        f"for argv in {[list(c) for c in COMMANDS]!r}:\n"
        "    with contextlib.redirect_stdout(io.StringIO()):\n"
        "        assert main([*argv, '--help']) == 0, argv\n"
        f"heavy = {HEAVY!r}\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy"
        " or m.startswith('areal_marlaas.config')))\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )

    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "argv, message",
    [
        ([], "the following arguments are required: COMMAND"),
        (["nope"], "invalid choice: 'nope'"),
        (["train"], "the following arguments are required: --config"),
        (["check", "--config", "x.yaml", "--bogus"], "unrecognized arguments: --bogus"),
        (["report"], "the following arguments are required: run_dir"),
        (["service"], "the following arguments are required: --config"),
        (["service", "tenant"], "the following arguments are required: tenant_command"),
        (["simulate", "b", "--fit-modes", "async,nope"], "unknown ['nope']"),
        (["simulate", "b", "--tenants", "0"], "argument --tenants: values must be"),
        (["simulate", "b", "--env-s", "ten"], "argument --env-s: expected seconds"),
        (["simulate", "b", "--train-devices", "0"], "--train-devices: must be >= 1"),
        (["bench-train-step", "--variants", "engine,x"], "--variants: unknown ['x']"),
        (["bench-train-step", "--lens", "50"], "--lens: expected min,max"),
        (["bench-train-step", "--prompt", "60"], "--lens min must exceed --prompt"),
        (["search-server", "--corpus", "c", "--workers", "0"], "--workers must be"),
        (["make-tiny-model", "--out", "x", "--arch", "gpt"], "invalid choice: 'gpt'"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else None,
)
def test_usage_error_exits_2_with_the_message_on_stderr(argv, message):
    r = marlaas(*argv)

    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stdout == ""
    assert message in r.stderr, r.stderr
    assert r.stderr.startswith("usage: marlaas")


def test_overrides_are_taken_before_between_and_after_the_flags():
    args = _parse(["train", "a=0", "--config", "X", "a=1", "--resume", "b=2", "c=3"])

    assert args.overrides == ["a=0", "a=1", "b=2", "c=3"]
    assert config_argv(args) == [
        "--config",
        "X",
        "--resume",
        "a=0",
        "a=1",
        "b=2",
        "c=3",
    ]
    args = _parse(["check", "--config", "X", "--tasks", "T", "--verbose"])
    assert config_argv(args) == ["--config", "X", "--tasks", "T", "--verbose"]


def test_service_runs_with_overrides_or_dispatches_its_operator_commands():
    from areal_marlaas.cli.run import _service, _service_operator

    args = _parse(["service", "--config", "X", "a=1", "--resume", "b=2"])
    assert args.handler is _service
    assert config_argv(args) == ["--config", "X", "--resume", "a=1", "b=2"]

    args = _parse(
        ["service", "tenant", "add", "acme", "service.root=R", "--config", "X"]
    )
    assert args.handler is _service_operator
    assert (args.command, args.tenant_command, args.name) == ("tenant", "add", "acme")
    assert args.config == "X" and args.overrides == ["service.root=R"]

    # --config before the subcommand is kept (the subcommand's own defaults none).
    args = _parse(["service", "--config", "X", "status", "k=v"])
    assert args.handler is _service_operator and args.command == "status"
    assert args.config == "X" and args.overrides == ["k=v"]


def test_an_unknown_option_after_an_override_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        _parse(["service", "--config", "X", "a=1", "--bogus"])
    assert e.value.code == 2
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err


def test_result_folders_default_to_the_ignored_runs_folder():
    outs = {
        path: action.default
        for path, parser in walk(build_parser())
        for action in parser._actions
        if action.dest == "out" and action.default is not None
    }

    assert outs == {
        ("bench-learning",): "runs/learning",
        ("bench-train-step",): "runs/train_step",
        ("simulate",): "runs/sim/sim.json",
        ("simulate-service",): "runs/sim_service/sim_service.json",
    }
    assert "/runs/" in (REPO / ".gitignore").read_text().split()


def test_help_texts_name_no_commit_or_issue():
    texts = []
    for _, parser in walk(build_parser()):
        texts.append(parser.format_help())
    text = "\n".join(texts)

    assert not re.search(r"\b[0-9a-f]{7,40}\b", text)
    assert not re.search(r"(?i)\bissue\s*#?\d+|#\d+\b", text)


def test_python_dash_m_runs_the_same_command():
    r = subprocess.run(
        [*MODULE, "check", "--help"], capture_output=True, text=True, timeout=60
    )

    assert r.returncode == 0 and r.stdout.startswith("usage: marlaas check")
