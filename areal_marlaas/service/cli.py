"""``marlaas service`` operator commands (wired in by the main CLI):

    marlaas service tenant add NAME     [--config X.yaml] [service.k=v ...]
    marlaas service tenant key NAME     (another key for NAME: rotation)
    marlaas service tenant list
    marlaas service tenant revoke NAME [--key PREFIX]
    marlaas service admin-key
    marlaas service status

API keys are printed once; only their sha256 is stored.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from areal_marlaas.errors import ConfigError

if TYPE_CHECKING:
    from areal_marlaas.config.service import ServiceConfig, ServiceRunConfig


def load_service_config(
    config_file: str | None, overrides: list[str]
) -> ServiceRunConfig:
    """The whole service config, through the project loader (so these commands
    read the same store as ``marlaas service --config X.yaml`` with the same
    overrides); without --config, the defaults plus the overrides."""
    import tempfile
    from pathlib import Path

    from areal_marlaas.config import load_config
    from areal_marlaas.config.service import ServiceRunConfig

    if config_file is None:
        empty = Path(tempfile.mkdtemp(prefix="marlaas-service-")) / "service.yaml"
        empty.write_text("{}\n")
        config_file = str(empty)
    cfg, _ = load_config(["--config", config_file, *overrides], ServiceRunConfig)
    return cfg


def _common() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    # SUPPRESS: a subcommand's default must not erase a --config given before it.
    common.add_argument(
        "--config", default=argparse.SUPPRESS, help="Main YAML (its service:)"
    )
    return common


def add_commands(sub: argparse._SubParsersAction, **defaults) -> None:
    """The operator commands as subparsers of ``sub`` (this module's own parser
    and the ``marlaas`` tree), each with ``defaults`` set. Imports nothing
    heavy: ``--help`` stays fast."""
    common = _common()
    tenant = sub.add_parser(
        "tenant",
        help="Manage tenants and their API keys",
        description="Manage tenants and their API keys",
    )
    tenant.set_defaults(**defaults)
    tsub = tenant.add_subparsers(dest="tenant_command", required=True)
    for name, text in (
        ("add", "Create a tenant; prints its API key once"),
        ("key", "Issue another API key for a tenant (rotation)"),
    ):
        t = tsub.add_parser(name, help=text, description=text, parents=[common])
        t.add_argument("name")
    text = "Tenants and their active key prefixes"
    tsub.add_parser("list", help=text, description=text, parents=[common])
    text = "Revoke a tenant's keys (all: also disables it)"
    t = tsub.add_parser("revoke", help=text, description=text, parents=[common])
    t.add_argument("name")
    t.add_argument("--key", default=None, help="Only keys with this display prefix")
    for name, text in (
        ("admin-key", "Print a new admin key (replaces the old)"),
        ("status", "Jobs per tenant with progress"),
    ):
        p = sub.add_parser(name, help=text, description=text, parents=[common])
        p.set_defaults(**defaults)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="marlaas service",
        description=(__doc__ or "").split("\n\n")[0],
        parents=[_common()],
    )
    add_commands(p.add_subparsers(dest="command", required=True))
    return p


def _store(cfg: ServiceConfig):
    from areal_marlaas.service.store import JobStore

    return JobStore.from_config(cfg)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args, rest = _parser().parse_known_args(argv)
    return run(args, rest)


def run(args: argparse.Namespace, overrides: list[str]) -> int:
    """One parsed operator command, with the config overrides that name the
    store."""
    from areal_marlaas.train.screen import quiet_console

    quiet_console()  # stdout carries keys and tables only
    try:
        cfg = load_service_config(getattr(args, "config", None), overrides).service
    except ConfigError as e:
        print(f"marlaas service: error: {e}", file=sys.stderr)
        return 2
    if args.command == "admin-key":
        from areal_marlaas.service.auth import new_admin_key

        key = new_admin_key(cfg.admin_key_path)
        print(key)
        print(
            f"Admin key hash written to {cfg.admin_key_path}; the key is shown only "
            "now.",
            file=sys.stderr,
        )
        return 0
    from areal_marlaas.service.store import Conflict, NotFound

    store = _store(cfg)
    try:
        if args.command == "status":
            from areal_marlaas.service.status import format_status

            print(format_status(store))
            return 0
        return _tenant(store, args)
    except (Conflict, NotFound, ValueError) as e:
        print(f"marlaas service: error: {e}", file=sys.stderr)
        return 1
    finally:
        store.close()


def _tenant(store, args: argparse.Namespace) -> int:
    cmd = args.tenant_command
    if cmd == "add":
        tenant, key = store.create_tenant(args.name)
        print(key)
        print(
            f"Tenant {tenant.name} ({tenant.id}) created; the key is shown only now.",
            file=sys.stderr,
        )
    elif cmd == "key":
        print(store.issue_key(args.name))
    elif cmd == "list":
        for t in store.list_tenants():
            state = "disabled" if t.disabled else "active"
            keys = ", ".join(t.active_keys) or "no active keys"
            print(f"{t.name}\t{t.id}\t{state}\t{keys}")
    elif cmd == "revoke":
        n = store.revoke(args.name, args.key)
        print(f"{n} key(s) of {args.name} revoked", file=sys.stderr)
        if n == 0 and args.key:
            return 1
    return 0
