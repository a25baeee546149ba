"""Can the cluster hold the workers a config asks for? Checked before anything
is placed, so an unplaceable spec fails at once naming the field, instead of
AReaL's placement group timing out with a raw ``GetTimeoutError``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from areal.api.alloc_mode import ModelAllocation

from areal_marlaas.errors import ConfigError

GIB = 1024**3


@dataclass
class Demand:
    """One worker's bundle, as AReaL's Ray scheduler asks for it."""

    field: str  # e.g. "actor.scheduling_spec.0"
    what: str  # e.g. "trainer worker"
    cpu: int
    mem: int  # GiB
    gpu: int


def demands(cfg) -> list[Demand]:
    """Every worker ``marlaas train`` creates: each trainer worker's ranks (one
    shared placement group per worker) and one rollout worker per server (one
    group each; the rollout controller multiplies its spec by the tp x pp
    instance size)."""
    out: list[Demand] = []
    world = ModelAllocation.from_str(cfg.actor.backend, name="actor").parallel
    specs = cfg.actor.scheduling_spec
    for _ in range(cfg.scheduler.trainers):
        for rank in range(world.world_size):
            i = rank if len(specs) == world.world_size else 0
            s = specs[i]
            out.append(
                Demand(
                    f"actor.scheduling_spec.{i}", "trainer worker", s.cpu, s.mem, s.gpu
                )
            )
    par = ModelAllocation.from_str(cfg.rollout.backend).parallel
    size = par.tp_size * par.pp_size
    s = cfg.rollout.scheduling_spec[0]
    for _ in range(par.dp_size):
        out.append(
            Demand(
                "rollout.scheduling_spec.0",
                "rollout worker",
                s.cpu * size,
                s.mem * size,
                size if s.gpu > 0 else 0,
            )
        )
    return out


def _resources(device: str, d: Demand | None = None) -> list[tuple[str, str, int]]:
    """(Ray resource, spec field, what ``d`` asks) for each resource checked."""
    out = [("CPU", "cpu", d.cpu if d else 0), ("memory", "mem", d.mem if d else 0)]
    if device != "CPU":
        out.append((device, "gpu", d.gpu if d else 0))
    return out


def _amount(d: Demand, key: str) -> float:
    """What ``d`` asks of a Ray resource (``CPU``, ``memory`` in bytes, or the
    accelerator)."""
    return {"CPU": d.cpu, "memory": d.mem * GIB}.get(key, d.gpu)


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def describe(nodes: list[dict[str, Any]], device: str) -> str:
    """``2 nodes: 2 CPUs, 7.5 GiB memory`` from ``ray.nodes()``-like records."""
    total: dict[str, float] = {}
    for n in nodes:
        for k, v in n["Resources"].items():
            total[k] = total.get(k, 0.0) + v
    text = (
        f"{len(nodes)} node{'s' * (len(nodes) != 1)}: {total.get('CPU', 0):g} CPUs, "
        f"{_gib(total.get('memory', 0))} memory"
    )
    if device != "CPU":
        text += f", {total.get(device, 0):g} {device}s"
    return text


def check_placeable(
    wanted: list[Demand], nodes: list[dict[str, Any]], device: str = "CPU"
) -> None:
    """Raise ``ConfigError`` naming each scheduling-spec field the cluster
    (``nodes``: alive ``ray.nodes()`` records) cannot hold, and the fix."""
    problems: list[str] = []
    seen: set[str] = set()

    def once(text: str) -> None:
        if text not in seen:
            seen.add(text)
            problems.append(text)

    def largest(key: str) -> float:
        return max((n["Resources"].get(key, 0.0) for n in nodes), default=0.0)

    for d in wanted:
        # AReaL runs a 1-CPU, 10 MB probe inside each worker's bundle to pick
        # the master address: a bundle without them waits forever.
        if d.cpu < 1:
            once(
                f"{d.field}.cpu={d.cpu}: every worker needs at least 1 CPU (AReaL "
                f"places a 1-CPU task in its bundle); set {d.field}.cpu=1."
            )
        if d.mem < 1:
            once(
                f"{d.field}.mem={d.mem}: every worker needs at least 1 GiB; set "
                f"{d.field}.mem=1."
            )
        if d.gpu > 0 and device == "CPU":
            once(
                f"{d.field}.gpu={d.gpu}, but this driver sees no GPU/NPU (AReaL sizes "
                f"bundles by the driver's device); set {d.field}.gpu=0 for CPU "
                "workers, or run marlaas on an accelerator node."
            )
            continue
        need = {"CPU": d.cpu, "memory": d.mem * GIB}
        if d.gpu > 0:
            need[device] = d.gpu
        if any(
            all(n["Resources"].get(k, 0.0) >= v for k, v in need.items()) for n in nodes
        ):
            continue
        named = False
        for key, name, value in _resources(device, d):
            most = largest(key)
            if need.get(key, 0) <= most:
                continue
            named = True
            if key == "memory":
                have, fix = _gib(most), max(1, int(most // GIB))
                unit = "GiB of memory"
            else:
                have, fix, unit = f"{most:g}", int(most), f"{key}s"
            once(
                f"{d.field}.{name}={value} cannot be placed: a {d.what} needs "
                f"{value} {unit} on one Ray node and the largest node has {have}; "
                f"set {d.field}.{name}={fix} or less, or add bigger nodes."
            )
        if not named:
            once(
                f"{d.field}: no single Ray node has cpu={d.cpu} and mem={d.mem} GiB "
                f"together for a {d.what}; lower {d.field}.cpu or {d.field}.mem."
            )
    if not problems:
        # Each worker fits a node; do they all fit the cluster together?
        for key, name, _ in _resources(device):
            want = sum(_amount(d, key) for d in wanted)
            have = sum(n["Resources"].get(key, 0.0) for n in nodes)
            if want <= have:
                continue
            fmt = _gib if key == "memory" else (lambda x: f"{x:g}")
            parts: dict[str, list[float]] = {}
            for d in wanted:
                parts.setdefault(f"{d.field}.{name}", []).append(_amount(d, key))
            detail = " + ".join(
                f"{len(v)} x {fmt(v[0])} ({k})" for k, v in parts.items()
            )
            problems.append(
                f"the workers need {fmt(want)} {key} in all ({detail}) but the "
                f"cluster has {fmt(have)}; lower {' / '.join(parts)}, or add nodes."
            )
    if problems:
        raise ConfigError(
            f"The Ray cluster ({describe(nodes, device)}) cannot place the workers:\n"
            + "\n".join(f"  - {p}" for p in problems)
            + "\nRay's CPUs and memory are logical: on a small machine cpu=1 and "
            "mem=1 per worker are enough (see docs/ray.md)."
        )
