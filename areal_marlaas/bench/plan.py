"""What ``marlaas bench`` runs: the workload per run, the runs, their cores."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from areal_marlaas.config import BenchConfig, ConfigError, MARLaaSConfig, TaskSpec
from areal_marlaas.config.bench import ABLATIONS, EVAL_ABLATIONS
from areal_marlaas.placement import parse_cpus

PLACEMENTS = ("disaggregated", "collocated")
# Replicated AReaL runs: N independent jobs, each with its own server, unpinned.
REPLICATED = "replicated"


@dataclass
class RunPlan:
    label: str
    mode: str
    placement: str
    tasks: list[TaskSpec]
    group: str  # mode | ablation | sweep
    overrides: dict[str, str] = field(default_factory=dict)
    scheduler: str = "null"  # null: in-process trainer; local: AReaL workers

    @property
    def tenants(self) -> int:
        return len(self.tasks)


# -- config ---------------------------------------------------------------------
def workload(bench: BenchConfig, cfg: MARLaaSConfig, n: int) -> list[TaskSpec]:
    """The first ``n`` tenants: replicas ``<task>_<i>`` (seed + i) of bench.task,
    or the task mix as given, cycled (renamed, reseeded) past its length."""
    if bench.task:
        by_name = {t.name: t for t in cfg.tasks}
        if bench.task not in by_name:
            raise ConfigError(
                f"bench.task: no task named {bench.task!r}; the tasks are "
                f"{sorted(by_name)}."
            )
        templates = [by_name[bench.task]]
    else:
        templates = list(cfg.tasks)
    out = []
    for i in range(n):
        t = templates[i % len(templates)]
        if not bench.task and i < len(templates):
            spec = t
        else:
            spec = dataclasses.replace(t, name=f"{t.name}_{i}", seed=t.seed + i)
        if bench.steps:
            spec = dataclasses.replace(spec, total_steps=bench.steps)
        out.append(spec)
    return out


def with_evals(tasks: list[TaskSpec], samples: int) -> list[TaskSpec]:
    """The same tasks, each evaluating ``samples`` rows after every step: the
    test split of its dataset with holdout 0.2 (the training rows are the
    baseline's, so the runs differ only by the evals)."""
    return [
        dataclasses.replace(
            t,
            eval_dataset=dataclasses.replace(t.dataset, split="test", holdout=0.2),
            eval_interval=1,
            eval_samples=samples,
        )
        for t in tasks
    ]


def plan_runs(bench: BenchConfig, cfg: MARLaaSConfig) -> list[RunPlan]:
    n = bench.replicas or len(cfg.tasks)
    tasks = workload(bench, cfg, n)
    plans = []
    for mode in bench.modes:
        placement = "collocated" if mode == "collocated" else "disaggregated"
        for sched in bench.schedulers:
            assert sched is not None  # BenchConfig turns null into "null"
            label = mode if sched == "null" else f"{mode}@{sched}"
            plans.append(
                RunPlan(label, mode, placement, tasks, "mode", scheduler=sched)
            )
    for name in bench.ablations:
        mode, extra, sched = ABLATIONS[name]
        plans.append(
            RunPlan(
                f"{mode}_{name}",
                mode,
                "disaggregated",
                with_evals(tasks, bench.eval_samples)
                if name in EVAL_ABLATIONS
                else tasks,
                "ablation",
                extra,
                scheduler=sched,
            )
        )
    for k in sorted({int(c) for c in bench.concurrency}):
        if k == n and bench.sweep_mode in bench.modes:
            continue  # the mode run is this sweep point
        placement = (
            "collocated" if bench.sweep_mode == "collocated" else "disaggregated"
        )
        plans.append(
            RunPlan(
                f"{bench.sweep_mode}_c{k}",
                bench.sweep_mode,
                placement,
                workload(bench, cfg, k),
                "sweep",
            )
        )
    for k in sorted({int(c) for c in bench.replicated}):
        plans.append(
            RunPlan(
                f"areal_x{k}",
                REPLICATED,
                REPLICATED,
                workload(bench, cfg, k),
                REPLICATED,
            )
        )
    return plans


def sweep_labels(bench: BenchConfig, cfg: MARLaaSConfig) -> dict[int, str]:
    n = bench.replicas or len(cfg.tasks)
    out = {}
    for k in sorted({int(c) for c in bench.concurrency}):
        same = k == n and bench.sweep_mode in bench.modes
        out[k] = bench.sweep_mode if same else f"{bench.sweep_mode}_c{k}"
    return out


def placement_cpus(bench: BenchConfig, placement: str) -> dict[str, Any]:
    if placement == "collocated":
        c = len(parse_cpus(bench.collocated_cpus, "bench.collocated_cpus"))
        return {
            "server_cpus": bench.collocated_cpus,
            "trainer_cpus": bench.collocated_cpus,
            "cores": (c, c, c),
        }
    s = len(parse_cpus(bench.server_cpus, "bench.server_cpus"))
    t = len(parse_cpus(bench.trainer_cpus, "bench.trainer_cpus"))
    return {
        "server_cpus": bench.server_cpus,
        "trainer_cpus": bench.trainer_cpus,
        "cores": (s, t, s + t),
    }


# -- running --------------------------------------------------------------------
