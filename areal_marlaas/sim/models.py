"""Latency models of the phases, fitted from measured ``events.jsonl`` logs.

Rollout: a processor-sharing server. With ``n`` sequences in flight on a device
the server generates ``min(n, max_seqs) ** beta`` sequence-work units per second,
shared equally, so each sequence progresses at ``min(n, M) ** beta / n``
(``beta`` < 1: batching gains; design.md's 8 seqs at 40 tok/s vs 32 seqs at
64 tok/s is ``beta`` = 0.34). A batch needs ``work`` units per sequence (the
time one sequence alone takes), scaled by its ``max_new_tokens`` against the
fit's, plus a fixed ``overhead`` (request fan-out, reward). A batch of ``s``
sequences alone thus takes ``overhead + work * s / min(s, M) ** beta``.

Train: ``intercept + per_seq * sequences`` (train + adapter save + commit).
Publish and env: constants (their means).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from areal_marlaas.bench.metrics import phase_records

DEFAULT_BETA = math.log(64 / 40) / math.log(32 / 8)  # design.md's CPU numbers


@dataclass
class RolloutModel:
    work_s: float  # seconds one sequence alone needs, at ref_max_new_tokens
    beta: float = DEFAULT_BETA
    overhead_s: float = 0.0
    max_seqs: int | None = None
    ref_max_new_tokens: int | None = None
    beta_fitted: bool = False

    def rate_per_seq(self, n: float) -> float:
        if n <= 0:
            return 0.0
        cap = n if self.max_seqs is None else min(n, self.max_seqs)
        return cap**self.beta / n

    def work_of(self, max_new_tokens: int | None) -> float:
        if max_new_tokens and self.ref_max_new_tokens:
            return self.work_s * max_new_tokens / self.ref_max_new_tokens
        return self.work_s

    def duration(self, n: float, max_new_tokens: int | None = None) -> float:
        """A batch whose sequences share the server with ``n`` in total."""
        return self.overhead_s + self.work_of(max_new_tokens) / self.rate_per_seq(n)


@dataclass
class LatencyModels:
    rollout: RolloutModel
    train_intercept_s: float
    train_per_seq_s: float = 0.0
    publish_s: float = 0.0
    env_s: float = 0.0
    fit: dict[str, Any] = field(default_factory=dict)  # diagnostics

    def train_s(self, seqs: int) -> float:
        return self.train_intercept_s + self.train_per_seq_s * seqs

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LatencyModels:
        return cls(**{**d, "rollout": RolloutModel(**d["rollout"])})


@dataclass
class RunLog:
    """What the fit needs of one run: its phase records and, per task, the
    sequences of one rollout batch and its ``max_new_tokens``."""

    events: list[dict[str, Any]]
    seqs: dict[str, int]
    max_new_tokens: dict[str, int] = field(default_factory=dict)


def mean_concurrency(
    rollouts: list[dict[str, Any]], seqs: dict[str, int]
) -> list[float]:
    """For each rollout interval, the time-averaged number of sequences in flight
    over it (its own and those of every overlapping rollout)."""
    out = []
    for r in rollouts:
        span = r["end"] - r["start"]
        if span <= 0:
            out.append(float(seqs[r["task"]]))
            continue
        total = 0.0
        for o in rollouts:
            overlap = min(r["end"], o["end"]) - max(r["start"], o["start"])
            if overlap > 0:
                total += seqs[o["task"]] * overlap
        out.append(total / span)
    return out


def _g(n: float, beta: float, cap: int | None) -> float:
    """Time factor of a batch sharing the server with ``n`` sequences."""
    return n / (n if cap is None else min(n, cap)) ** beta


def fit_rollout(
    runs: list[RunLog],
    max_seqs: int | None = None,
    default_beta: float = DEFAULT_BETA,
) -> tuple[RolloutModel, dict[str, Any]]:
    """Least squares over a (beta, overhead) grid, the work in closed form in log
    space; beta is kept at ``default_beta`` when the runs show too little spread
    in concurrency to tell it."""
    xs: list[tuple[float, float, float]] = []  # (n, duration, token scale)
    mnts = [m for r in runs for m in r.max_new_tokens.values() if m]
    ref = statistics.median(mnts) if mnts else None
    for run in runs:
        rolls = [e for e in phase_records(run.events) if e["phase"] == "rollout"]
        for e, n in zip(rolls, mean_concurrency(rolls, run.seqs)):
            scale = (run.max_new_tokens.get(e["task"]) or ref or 1) / (ref or 1)
            xs.append((n, e["end"] - e["start"], scale))
    if not xs:
        raise ValueError("no rollout records to fit")
    ns = [n for n, _, _ in xs]
    identifiable = max(ns) / min(ns) >= 1.2
    betas = [i / 100 for i in range(101)] if identifiable else [default_beta]
    d_min = min(d for _, d, _ in xs)
    overheads = [d_min * i / 40 for i in range(0, 36)]
    best = None
    for beta in betas:
        for o in overheads:
            logs = [
                math.log(max(d - o, 1e-9)) - math.log(_g(n, beta, max_seqs) * s)
                for n, d, s in xs
            ]
            work = math.exp(statistics.fmean(logs))
            sse = sum(
                (d - (o + work * s * _g(n, beta, max_seqs))) ** 2 for n, d, s in xs
            )
            if best is None or sse < best[0] - 1e-12:
                best = (sse, beta, o, work)
    sse, beta, o, work = best
    model = RolloutModel(
        work_s=work,
        beta=beta,
        overhead_s=o,
        max_seqs=max_seqs,
        ref_max_new_tokens=int(ref) if ref else None,
        beta_fitted=identifiable,
    )
    rmse = math.sqrt(sse / len(xs))
    return model, {
        "rollouts": len(xs),
        "concurrency_range": [min(ns), max(ns)],
        "rmse_s": rmse,
    }


def fit_models(
    runs: list[RunLog],
    max_seqs: int | None = None,
    default_beta: float = DEFAULT_BETA,
) -> LatencyModels:
    rollout, diag = fit_rollout(runs, max_seqs, default_beta)
    trains: list[tuple[int, float]] = []
    publishes: list[float] = []
    envs: list[float] = []
    for run in runs:
        for e in phase_records(run.events):
            d = e["end"] - e["start"]
            if e["phase"] == "train":
                trains.append((run.seqs[e["task"]], d))
            elif e["phase"] == "publish":
                publishes.append(d)
            elif e["phase"] == "env":
                envs.append(d)
    if not trains:
        raise ValueError("no train records to fit")
    s = [x for x, _ in trains]
    d = [y for _, y in trains]
    if len(set(s)) > 1:
        slope, intercept = statistics.linear_regression(s, d)
        slope = max(slope, 0.0)
        intercept = statistics.fmean(d) - slope * statistics.fmean(s)
    else:
        slope, intercept = 0.0, statistics.fmean(d)
    diag["trains"] = len(trains)
    diag["train_rmse_s"] = math.sqrt(
        statistics.fmean((y - intercept - slope * x) ** 2 for x, y in trains)
    )
    return LatencyModels(
        rollout=rollout,
        train_intercept_s=intercept,
        train_per_seq_s=slope,
        publish_s=statistics.fmean(publishes) if publishes else 0.0,
        env_s=statistics.fmean(envs) if envs else 0.0,
        fit=diag,
    )
