"""Argument pieces the ``marlaas`` commands share: the config arguments
(``--config X.yaml [--tasks T.yaml] [key=value ...]``), the subcommands of a
command that also runs on its own, and comma-list value types.

Nothing here imports AReaL or torch: ``marlaas <cmd> --help`` must stay fast and
print nothing but the help."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import NoReturn

# Where commands that write results put them by default: an ignored folder of
# the working directory, never the tracked docs/results tree.
RUNS_DIR = "runs"

Handler = Callable[[argparse.Namespace], int]


def add_command(
    sub: argparse._SubParsersAction,
    name: str,
    handler: Handler,
    help: str,
    description: str | None = None,
    **kwargs,
) -> argparse.ArgumentParser:
    """A subcommand whose parsed arguments go to ``handler``; the handler reports
    usage errors through ``fail(args, ...)`` (the subcommand's own usage)."""
    p = sub.add_parser(name, help=help, description=description or help, **kwargs)
    p.set_defaults(handler=handler, command_parser=p)
    return p


def add_config_args(p: argparse.ArgumentParser, required: bool = True) -> None:
    """``--config X.yaml [--tasks T.yaml] [--resume] [--verbose] [key=value ...]``;
    the overrides are hydra-style and may come before, between or after the
    flags."""
    p.add_argument(
        "--config", required=required, default=None, metavar="X.yaml", help="Main YAML"
    )
    p.add_argument(
        "--tasks",
        default=None,
        metavar="T.yaml",
        help="Tasks YAML (overrides the config's tasks_file)",
    )
    p.add_argument(
        "--resume", action="store_true", help="Same as the override resume=true"
    )
    p.add_argument(
        "--verbose",
        action="store_true",
        help="AReaL's logs on the screen too (same as verbose=true)",
    )
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="Config overrides, e.g. scheduler.mode=sync +tasks_file=T.yaml",
    )


def config_argv(args: argparse.Namespace) -> list[str]:
    """The parsed config arguments as the config loader (and the early readers
    of the command line) take them."""
    argv = ["--config", args.config] if args.config is not None else []
    if args.tasks is not None:
        argv += ["--tasks", args.tasks]
    if args.resume:
        argv.append("--resume")
    if args.verbose:
        argv.append("--verbose")
    return [*argv, *args.overrides]


def fail(args: argparse.Namespace, message: str) -> NoReturn:
    """A usage error of the running command: its usage and the message on
    stderr, exit code 2."""
    parser: argparse.ArgumentParser = args.command_parser
    parser.error(message)


class CommandOrOverrides(argparse._SubParsersAction):
    """Subcommands of a command that also runs on its own with key=value
    overrides (``marlaas service --config X.yaml k=v`` next to ``marlaas service
    tenant add NAME``): a first positional that names no subcommand is the
    first override of the command's own run, and the rest of the line parses as
    that command's again (its flags, further overrides)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # argparse would refuse an override as an invalid choice before
        # __call__; the choices are checked there instead.
        self.choices = None  # pyright: ignore[reportAttributeAccessIssue]

    def __call__(self, parser, namespace, values, option_string=None):
        assert isinstance(values, list)  # nargs=PARSER: the rest of the line
        if values[0] in self._name_parser_map:
            return super().__call__(parser, namespace, values, option_string)
        namespace.overrides = [*getattr(namespace, "overrides", []), values[0]]
        _, rest = parser.parse_known_args(values[1:], namespace)
        # Unknown options among them are reported with the others in main().
        namespace.overrides = [*namespace.overrides, *rest]


def comma_list(
    item: Callable[[str], float],
    expected: str,
    minimum: float | None = None,
    nonempty: bool = False,
) -> Callable[[str], list]:
    """An argparse type: ``a,b,c`` of ``item`` values (blank items skipped),
    each >= ``minimum`` when given; ``expected`` says what a good value is."""

    def parse(text: str) -> list:
        try:
            values = [item(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected {expected}, got {text!r}"
            ) from None
        if nonempty and not values:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        if minimum is not None and any(v < minimum for v in values):
            raise argparse.ArgumentTypeError(
                f"values must be >= {minimum}, got {text!r}"
            )
        return values

    return parse


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value
