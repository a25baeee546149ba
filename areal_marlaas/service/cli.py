"""``marlaas service`` operator commands (wired in by the main CLI):

    marlaas service tenant add NAME     [--config X.yaml] [service.k=v ...]
    marlaas service tenant key NAME     (another key for NAME: rotation)
    marlaas service tenant weight NAME W (its fair share; add takes --weight W)
    marlaas service tenant list
    marlaas service tenant revoke NAME [--key PREFIX]
    marlaas service tenant webhook add NAME --url URL [--secret whsec_...]
    marlaas service tenant webhook list NAME
    marlaas service tenant webhook remove NAME WEBHOOK_ID
    marlaas service tenant webhook deliveries NAME [--limit N]
    marlaas service admin-key
    marlaas service status

API keys are printed once; only their sha256 is stored. A generated webhook
secret is printed once too (it is stored: signing needs it).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING

from areal_marlaas.errors import ConfigError

if TYPE_CHECKING:
    from areal_marlaas.config.service import ServiceConfig, ServiceRunConfig
    from areal_marlaas.service.tables import WebhookDelivery


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


WEIGHT_HELP = (
    "Share of the trainer relative to other tenants under "
    "scheduler.train_order=fair (default 1; a weight-2 tenant gets twice a "
    "weight-1 one's trainer time while both wait)"
)


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
    text = "Create a tenant; prints its API key once"
    t = tsub.add_parser("add", help=text, description=text, parents=[common])
    t.add_argument("name")
    t.add_argument("--weight", type=float, default=1.0, help=WEIGHT_HELP)
    text = "Issue another API key for a tenant (rotation)"
    t = tsub.add_parser("key", help=text, description=text, parents=[common])
    t.add_argument("name")
    text = "Set a tenant's weight (its running jobs follow at the next poll)"
    t = tsub.add_parser("weight", help=text, description=text, parents=[common])
    t.add_argument("name")
    t.add_argument("weight", type=float, help=WEIGHT_HELP)
    text = "Tenants and their active key prefixes"
    tsub.add_parser("list", help=text, description=text, parents=[common])
    text = "Revoke a tenant's keys (all: also disables it)"
    t = tsub.add_parser("revoke", help=text, description=text, parents=[common])
    t.add_argument("name")
    t.add_argument("--key", default=None, help="Only keys with this display prefix")
    _webhook_commands(tsub, common)
    for name, text in (
        ("admin-key", "Print a new admin key (replaces the old)"),
        ("status", "Jobs per tenant with progress"),
    ):
        p = sub.add_parser(name, help=text, description=text, parents=[common])
        p.set_defaults(**defaults)


def _webhook_commands(
    tsub: argparse._SubParsersAction, common: argparse.ArgumentParser
) -> None:
    text = "Manage a tenant's webhooks (job succeeded / failed / cancelled events)"
    hook = tsub.add_parser("webhook", help=text, description=text)
    wsub = hook.add_subparsers(dest="webhook_command", required=True)
    text = "Register a webhook URL; prints its id, and a generated secret once"
    w = wsub.add_parser("add", help=text, description=text, parents=[common])
    w.add_argument("name")
    w.add_argument("--url", required=True, help="http(s) URL the events are POSTed to")
    w.add_argument(
        "--secret",
        default=None,
        help="Signing secret whsec_<base64 of 24-64 bytes>; default: a new one",
    )
    text = "A tenant's webhooks"
    w = wsub.add_parser("list", help=text, description=text, parents=[common])
    w.add_argument("name")
    text = "Remove a webhook; its pending deliveries are cancelled"
    w = wsub.add_parser("remove", help=text, description=text, parents=[common])
    w.add_argument("name")
    w.add_argument("webhook_id")
    text = "A tenant's webhook delivery log, newest first"
    w = wsub.add_parser("deliveries", help=text, description=text, parents=[common])
    w.add_argument("name")
    w.add_argument("--limit", type=int, default=20, help="Rows shown (default 20)")


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
        tenant, key = store.create_tenant(args.name, args.weight)
        print(key)
        print(
            f"Tenant {tenant.name} ({tenant.id}) created; the key is shown only now.",
            file=sys.stderr,
        )
    elif cmd == "key":
        print(store.issue_key(args.name))
    elif cmd == "weight":
        store.set_weight(args.name, args.weight)
        print(f"Tenant {args.name}: weight {args.weight:g}", file=sys.stderr)
    elif cmd == "list":
        for t in store.list_tenants():
            state = "disabled" if t.disabled else "active"
            keys = ", ".join(t.active_keys) or "no active keys"
            print(f"{t.name}\t{t.id}\t{state}\tweight {t.weight:g}\t{keys}")
    elif cmd == "webhook":
        return _webhook(store, args)
    elif cmd == "revoke":
        n = store.revoke(args.name, args.key)
        print(f"{n} key(s) of {args.name} revoked", file=sys.stderr)
        if n == 0 and args.key:
            return 1
    return 0


def _webhook(store, args: argparse.Namespace) -> int:
    cmd = args.webhook_command
    if cmd == "add":
        hook = store.add_webhook(args.name, args.url, args.secret)
        print(hook.id)
        if args.secret is None:
            print(hook.secret)
        shown = "; the secret is shown only now" if args.secret is None else ""
        print(
            f"Webhook {hook.id} of {args.name} -> {hook.url}{shown}.", file=sys.stderr
        )
    elif cmd == "list":
        for h in store.list_webhooks(args.name):
            print(f"{h.id}\t{h.url}\t{_when(h.created_at)}")
    elif cmd == "remove":
        n = store.remove_webhook(args.name, args.webhook_id)
        print(
            f"Webhook {args.webhook_id} of {args.name} removed; {n} pending "
            "delivery(ies) cancelled",
            file=sys.stderr,
        )
    elif cmd == "deliveries":
        if args.limit < 1:
            raise ValueError(f"--limit must be >= 1, got {args.limit}")
        print(_deliveries_table(store.deliveries(args.name, args.limit)))
    return 0


def _deliveries_table(rows: list[WebhookDelivery]) -> str:
    header = ("created", "event", "job", "webhook", "status", "attempts", "last")
    table: list[tuple[str, ...]] = [header]
    for d in rows:
        if d.status == "pending":
            then = f"next {_when(d.next_attempt_at)}"
        else:
            then = _when(d.finished_at)
        last = "-"
        if d.last_attempt_at is not None:
            outcome = d.last_error or f"HTTP {d.last_status_code}"
            last = f"{_when(d.last_attempt_at)} {outcome}"
        table.append(
            (
                _when(d.created_at),
                d.event_type,
                d.job_id,
                d.webhook_id,
                f"{d.status} ({then})",
                str(d.attempts),
                last.replace("\n", " "),
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(header) - 1)]
    return "\n".join(
        "  ".join(
            [*(c.ljust(w) for c, w in zip(row[:-1], widths, strict=True)), row[-1]]
        ).rstrip()
        for row in table
    )


def _when(t: float | None) -> str:
    return "-" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))
