"""``marlaas simulate`` (fit a bench run, validate, project) and ``marlaas
report`` (time per phase of a run)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from areal_marlaas.cli.args import RUNS_DIR, add_command, comma_list, positive_int


def _report(args: argparse.Namespace) -> int:
    from areal_marlaas.rundir.phases import format_phase_stats, phase_stats

    print(format_phase_stats(phase_stats(args.run_dir)))
    return 0


def _fit_modes(text: str) -> list[str]:
    from areal_marlaas.scheduler.core import MODES

    modes = [m.strip() for m in text.split(",") if m.strip()]
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown {unknown}; choose from {list(MODES)}"
        )
    return modes


def _simulate(args: argparse.Namespace) -> int:
    from areal_marlaas.sim.latency import LatencyModels
    from areal_marlaas.sim.project import (
        format_models,
        format_projection,
        format_sim_markdown,
        format_validation,
        simulate_bench,
    )

    kv = int(args.kv_budget_gib * 2**30) if args.kv_budget_gib else None
    try:
        out = simulate_bench(
            args.bench,
            args.tenants,
            args.rollout_devices,
            args.train_devices,
            kv,
            args.steps,
            args.fit_modes or None,
            args.predict,
            mix=args.mix,
            env_s=args.env_s or None,
        )
    except (FileNotFoundError, ValueError) as e:
        print(f"marlaas simulate: error: {e}", file=sys.stderr)
        return 2
    models = {p: LatencyModels.from_dict(m) for p, m in out["models"].items()}
    print(format_models(models))
    print("\nmeasured vs simulated (each measured configuration):")
    print(format_validation(out["validation"]))
    c = out["cluster"]
    print(
        f"\nprojection: {c['rollout_devices']} rollout device(s), "
        f"{c['train_devices']} train device(s), KV budget "
        f"{(c['kv_budget_per_device'] or 0) / 2**30:.1f} GiB per rollout device:"
    )
    print(format_projection(out["projection"]))
    dest = Path(args.out)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(out, indent=1))
    dest.with_suffix(".md").write_text(format_sim_markdown(out))
    print(f"wrote {dest} and {dest.with_suffix('.md')}")
    return 0


def _simulate_service(args: argparse.Namespace) -> int:
    from areal_marlaas.sim.fit_input import FIT_INPUT
    from areal_marlaas.sim.service import (
        POLICIES,
        format_service_sim,
        load_service_fit,
        simulate_service,
    )

    root = Path(args.result)
    root = root.parent if root.is_file() else root
    try:
        if args.fit_service not in POLICIES:
            raise ValueError(
                f"--fit-service {args.fit_service!r}: choose from {list(POLICIES)}"
            )
        result = json.loads((root / "bench_service.json").read_text())
        fit = load_service_fit((root / FIT_INPUT).read_text())
        out = simulate_service(result, fit, args.fit_service, args.tenants)
    except (FileNotFoundError, ValueError) as e:
        print(f"marlaas simulate-service: error: {e}", file=sys.stderr)
        return 2
    md = format_service_sim(out)
    print(md)
    dest = Path(args.out)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(out, indent=1))
    dest.with_suffix(".md").write_text(md)
    print(f"wrote {dest} and {dest.with_suffix('.md')}")
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub, "report", _report, "Time per phase and task of a run directory"
    )
    p.add_argument("run_dir", help="The run directory (<fileroot>/<experiment>)")

    p = add_command(
        sub,
        "simulate",
        _simulate,
        "Fit a bench run, validate, project to many tenants",
        description="Fit latency models on a `marlaas bench` run, check them "
        "against its measured runs, and project the scheduling modes to many "
        "tenants and devices.",
    )
    p.add_argument("bench", help="bench.json or the folder holding it")
    p.add_argument(
        "--tenants",
        type=comma_list(int, "e.g. 1,32,1000", minimum=1, nonempty=True),
        default="1,32,1000",
        help="Tenant counts, e.g. 1,32 (default: %(default)s)",
    )
    p.add_argument("--rollout-devices", type=positive_int, default=1)
    p.add_argument("--train-devices", type=positive_int, default=1)
    p.add_argument(
        "--kv-budget-gib",
        type=float,
        default=None,
        help="KV budget per rollout device (default: the bench server's)",
    )
    p.add_argument("--steps", type=int, default=None, help="Steps per tenant")
    p.add_argument(
        "--fit-modes",
        type=_fit_modes,
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
        type=comma_list(float, "seconds, e.g. 10,60", minimum=0),
        default="",
        help="Sweep every projected task's tool-call seconds per batch, e.g. "
        "10,60 (default: each task's fitted time)",
    )
    p.add_argument(
        "--out",
        default=f"{RUNS_DIR}/sim/sim.json",
        help="JSON, with the markdown beside it (default: %(default)s; runs/ is "
        "ignored: a result to keep is copied to docs/results/)",
    )

    p = add_command(
        sub,
        "simulate-service",
        _simulate_service,
        "Fit a bench-service run, replay it per policy, project to many tenants",
        description="Fit latency models on one service's `marlaas bench-service` "
        "runs, replay every measured run under its own service's policy (the "
        "other services out of sample), and project async, fair and "
        "fair_adaptive to many tenants (trainers and servers scaled with them). "
        "Writes sim_service.json and .md (default: under runs/sim_service/).",
    )
    p.add_argument("result", help="bench_service.json or the folder holding it")
    p.add_argument(
        "--out",
        default=f"{RUNS_DIR}/sim_service/sim_service.json",
        help="JSON, with the markdown beside it (default: %(default)s)",
    )
    p.add_argument(
        "--fit-service",
        default="async",
        help="The service whose runs are fitted (default: %(default)s)",
    )
    p.add_argument(
        "--tenants",
        type=comma_list(int, "e.g. 100,1000", minimum=1, nonempty=True),
        default="100,1000",
        help="Tenant counts to project (default: %(default)s)",
    )
