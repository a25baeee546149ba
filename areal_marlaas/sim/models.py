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
Publish: a constant (its mean).

Env (tool calls, e.g. the search agent's searches): per task, the time a batch
spends with at least one episode waiting on a tool (the union of the batch's
tool-call intervals), averaged over the task's batches. It is taken out of the
batch's rollout time before the server is fitted, and the simulator adds it back
after the batch's generation, off the server.
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
    env_s: float = 0.0  # tasks the fit has no env time for
    env_by_task: dict[str, float] = field(default_factory=dict)
    fit: dict[str, Any] = field(default_factory=dict)  # diagnostics

    def train_s(self, seqs: int) -> float:
        return self.train_intercept_s + self.train_per_seq_s * seqs

    def env_of(self, task: str) -> float:
        return self.env_by_task.get(task, self.env_s)

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


Segments = list[tuple[float, float]]


def merge(intervals: Segments) -> Segments:
    """The intervals as sorted, disjoint segments."""
    out: Segments = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _length(segs: Segments) -> float:
    return sum(b - a for a, b in segs)


def _overlap(xs: Segments, ys: Segments) -> float:
    return sum(max(0.0, min(b, d) - max(a, c)) for a, b in xs for c, d in ys)


def batch_env(events: list[dict[str, Any]]) -> dict[tuple[str, int], Segments]:
    """Each batch's (task, version) tool-call time, as merged segments: the time
    at least one of its episodes waited on a tool."""
    by_batch: dict[tuple[str, int], Segments] = {}
    for e in phase_records(events):
        if e["phase"] == "env":
            key = (e["task"], e["version"])
            by_batch.setdefault(key, []).append((e["start"], e["end"]))
    return {k: merge(v) for k, v in by_batch.items()}


def generation(rollout: dict[str, Any], env: Segments) -> Segments:
    """The rollout interval less its batch's tool-call time: when its sequences
    were on the server."""
    out, at = [], rollout["start"]
    for a, b in env:
        if a > at:
            out.append((at, min(a, rollout["end"])))
        at = max(at, b)
    if rollout["end"] > at:
        out.append((at, rollout["end"]))
    return [(a, b) for a, b in out if b > a]


def mean_concurrency(
    rollouts: list[dict[str, Any]],
    seqs: dict[str, int],
    env: dict[tuple[str, int], Segments] | None = None,
) -> list[float]:
    """For each rollout, the time-averaged number of sequences on the server over
    its generation time (its own and those of every overlapping rollout's
    generation)."""
    env = env or {}
    gens = [generation(r, env.get((r["task"], r.get("version")), [])) for r in rollouts]
    out = []
    for r, g in zip(rollouts, gens):
        span = _length(g)
        if span <= 0:
            out.append(float(seqs[r["task"]]))
            continue
        total = sum(seqs[o["task"]] * _overlap(g, h) for o, h in zip(rollouts, gens))
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
        env = batch_env(run.events)
        for e, n in zip(rolls, mean_concurrency(rolls, run.seqs, env)):
            scale = (run.max_new_tokens.get(e["task"]) or ref or 1) / (ref or 1)
            gen = _length(generation(e, env.get((e["task"], e["version"]), [])))
            xs.append((n, max(gen, 1e-3), scale))
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
    envs: dict[str, list[float]] = {}
    for run in runs:
        env = batch_env(run.events)
        for e in phase_records(run.events):
            d = e["end"] - e["start"]
            if e["phase"] == "train":
                trains.append((run.seqs[e["task"]], d))
            elif e["phase"] == "publish":
                publishes.append(d)
            elif e["phase"] == "rollout":
                # Every batch counts, those that made no tool call as 0 s.
                key = (e["task"], e["version"])
                envs.setdefault(e["task"], []).append(_length(env.get(key, [])))
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
        env_by_task={t: statistics.fmean(v) for t, v in envs.items() if any(v)},
        fit=diag,
    )
