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

Per task and contention: a task (its profile: replicas of one task share theirs)
the fit saw at several concurrency levels gets its own work per sequence, and
every task the fit saw its own train step time
(a mix of tasks differs in more than ``max_new_tokens``: answer lengths,
multi-turn episodes, sequence lengths); others get the shared models above. A
train step runs ``1 + train_contention`` times slower while sequences generate
(the server's cores and the trainer's share caches and memory bandwidth),
fitted from how much of each step overlapped generation (0 when the fit runs
show no spread in it). Generation runs as many times slower while a train step
runs: the contention is taken as symmetric (both share the machine's caches and
memory bandwidth) and comes from the train side, because fitted on its own it is
confounded with the batching gain (tried on the committed async benches: it
traded beta for contention and missed sequential runs by 26%; on async + sync
runs it fitted beta 0 and x1.7 and missed sequential by 19%).

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

import numpy as np

from areal_marlaas.bench.run_metrics import phase_records

DEFAULT_BETA = math.log(64 / 40) / math.log(32 / 8)  # design.md's CPU numbers


@dataclass
class RolloutModel:
    work_s: float  # seconds one sequence alone needs, at ref_max_new_tokens
    beta: float = DEFAULT_BETA
    overhead_s: float = 0.0
    max_seqs: int | None = None
    ref_max_new_tokens: int | None = None
    beta_fitted: bool = False
    work_by_task: dict[str, float] = field(default_factory=dict)
    contention: float = 0.0  # generation slows by 1 + this while a step trains

    def rate_per_seq(self, n: float) -> float:
        if n <= 0:
            return 0.0
        cap = n if self.max_seqs is None else min(n, self.max_seqs)
        return cap**self.beta / n

    def work_of(self, max_new_tokens: int | None, task: str | None = None) -> float:
        if task in self.work_by_task:
            return self.work_by_task[task]
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
    train_by_task: dict[str, float] = field(default_factory=dict)  # alone
    train_contention: float = 0.0  # a step slows by 1 + this while seqs generate
    fit: dict[str, Any] = field(default_factory=dict)  # diagnostics

    def train_s(self, seqs: int, task: str | None = None) -> float:
        """A step's train time with the server idle."""
        if task in self.train_by_task:
            return self.train_by_task[task]
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
    sequences of one rollout batch, its ``max_new_tokens`` and its profile (the
    task definition it runs: replicas of one task share one; default its
    name), which is what per-task latencies are fitted and looked up by."""

    events: list[dict[str, Any]]
    seqs: dict[str, int]
    max_new_tokens: dict[str, int] = field(default_factory=dict)
    profile: dict[str, str] = field(default_factory=dict)

    def profile_of(self, task: str) -> str:
        return self.profile.get(task, task)


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
    # A record without a version (None in the key) finds no env segments.
    gens = [
        generation(r, env.get((r["task"], r.get("version")), []))  # pyright: ignore[reportCallIssue, reportArgumentType]
        for r in rollouts
    ]
    out = []
    for r, g in zip(rollouts, gens, strict=True):
        span = _length(g)
        if span <= 0:
            out.append(float(seqs[r["task"]]))
            continue
        total = sum(
            seqs[o["task"]] * _overlap(g, h)
            for o, h in zip(rollouts, gens, strict=True)
        )
        out.append(total / span)
    return out


def _generating_shares(
    events: list[dict[str, Any]], env: dict[tuple[str, int], Segments]
) -> list[float]:
    """Per train step (in record order), the share of it during which sequences
    generated on the server."""
    records = phase_records(events)
    generating = merge(
        [
            seg
            for r in records
            if r["phase"] == "rollout"
            for seg in generation(r, env.get((r["task"], r["version"]), []))
        ]
    )
    return [
        _overlap([(t["start"], t["end"])], generating) / (t["end"] - t["start"])
        if t["end"] > t["start"]
        else 0.0
        for t in records
        if t["phase"] == "train"
    ]


def _contentions(shares: list[float]) -> list[float]:
    """The contention factors worth trying: none unless the shares spread."""
    if not shares or max(shares) - min(shares) < 0.2:
        return [0.0]
    return [i / 20 for i in range(41)]  # 0 .. 2


def _training_shares(
    records: list[dict[str, Any]], env: dict[tuple[str, int], Segments]
) -> list[float]:
    """Per rollout (in record order), the share of its generation time during
    which a train step ran."""
    training = merge([(t["start"], t["end"]) for t in records if t["phase"] == "train"])
    out = []
    for r in records:
        if r["phase"] == "rollout":
            gen = generation(r, env.get((r["task"], r["version"]), []))
            span = _length(gen)
            out.append(_overlap(gen, training) / span if span > 0 else 0.0)
    return out


def fit_rollout(
    runs: list[RunLog],
    max_seqs: int | None = None,
    default_beta: float = DEFAULT_BETA,
    contention: float = 0.0,
) -> tuple[RolloutModel, dict[str, Any]]:
    """Least squares over a (beta, overhead) grid, the work (each task's or the
    shared one) in closed form in log space; beta is kept at ``default_beta``
    when the runs show too little spread in concurrency to tell it. Generation
    beside a train step is taken to run at ``1 / (1 + contention)`` speed."""
    rows: list[tuple[str, float, float, float, float]] = []  # profile n d scale s
    mnts = [m for r in runs for m in r.max_new_tokens.values() if m]
    ref = statistics.median(mnts) if mnts else None
    for run in runs:
        records = phase_records(run.events)
        rolls = [e for e in records if e["phase"] == "rollout"]
        env = batch_env(run.events)
        concurrency = mean_concurrency(rolls, run.seqs, env)
        for e, n, sh in zip(
            rolls, concurrency, _training_shares(records, env), strict=True
        ):
            scale = (run.max_new_tokens.get(e["task"]) or ref or 1) / (ref or 1)
            gen = _length(generation(e, env.get((e["task"], e["version"]), [])))
            rows.append((run.profile_of(e["task"]), n, max(gen, 1e-3), scale, sh))
    if not rows:
        raise ValueError("no rollout records to fit")
    n, d, scale, share = (np.array([r[i] for r in rows]) for i in range(1, 5))
    # A task seen at several concurrency levels gets its own work; the others
    # share one (scaled by max_new_tokens), so that their work cannot absorb
    # what concurrency does.
    levels: dict[str, list[float]] = {}
    for r in rows:
        levels.setdefault(r[0], []).append(r[1])
    own = sorted(t for t, ns in levels.items() if max(ns) / min(ns) >= 1.2)
    groups = [*own, "*"]
    idx = np.array([groups.index(r[0]) if r[0] in own else len(own) for r in rows])
    # x @ mean_of: each group's mean of x (empty groups: 0)
    mean_of = np.eye(len(groups))[idx]
    mean_of /= np.maximum(mean_of.sum(axis=0), 1)
    identifiable = n.max() / n.min() >= 1.2
    betas = [i / 100 for i in range(101)] if identifiable else [default_beta]
    overheads = np.array([d.min() * i / 40 for i in range(0, 36)])
    logd = np.log(np.maximum(d[None, :] - overheads[:, None], 1e-9))
    cap = n if max_seqs is None else np.minimum(n, max_seqs)
    # Generation that spent share s of its time beside training, at
    # 1 / (1 + c) speed there, took 1 / (1 - s * c / (1 + c)) times what the
    # same work alone takes (the train fit's form).
    slow = 1 / (1 - share * contention / (1 + contention))
    best = None
    for beta in betas:
        g = n / cap**beta
        f = g * scale * slow
        logw = (logd - np.log(f)[None, :]) @ mean_of
        pred = overheads[:, None] + np.exp(logw)[:, idx] * f[None, :]
        sse = ((d[None, :] - pred) ** 2).sum(axis=1)
        k = int(sse.argmin())
        if best is None or sse[k] < best[0] - 1e-12:
            best = (float(sse[k]), beta, float(overheads[k]), logw[k], f)
    assert best is not None  # betas is never empty
    sse, beta, o, logw, f = best
    # The shared work (per sequence at ref_max_new_tokens), for the tasks
    # without their own: the shared group's, or every rollout's when none is.
    shared = idx == len(own)
    pick = shared if shared.any() else np.ones_like(shared)
    work = math.exp(
        float(np.mean(np.log(np.maximum(d - o, 1e-9))[pick] - np.log(f)[pick]))
    )
    task_scale = {r[0]: r[3] for r in rows}
    model = RolloutModel(
        work_s=work,
        beta=beta,
        overhead_s=o,
        max_seqs=max_seqs,
        ref_max_new_tokens=int(ref) if ref else None,
        beta_fitted=bool(identifiable),
        work_by_task={
            t: math.exp(float(logw[i])) * task_scale[t] for i, t in enumerate(own)
        },
        contention=contention,
    )
    rmse = math.sqrt(sse / len(rows))
    return model, {
        "rollouts": len(rows),
        "concurrency_range": [float(n.min()), float(n.max())],
        "rmse_s": rmse,
    }


def _fit_train(
    rows: list[tuple[str, int, float, float]],
) -> tuple[dict[str, float], float, float, float, float]:
    """(task, sequences, duration, share generating) -> each task's step time
    alone, the contention factor, the alone line's intercept and slope, rmse.
    A step that spent share ``s`` of its ``d`` seconds beside generation at
    ``1 / (1 + c)`` speed did ``d * (1 - s * c / (1 + c))`` seconds of work."""

    def work(d: float, share: float, c: float) -> float:
        return d * (1 - share * c / (1 + c))

    best = None
    for c in _contentions([r[3] for r in rows]):
        alone: dict[str, list[float]] = {}
        for task, _, d, share in rows:
            alone.setdefault(task, []).append(work(d, share, c))
        means = {t: statistics.fmean(v) for t, v in alone.items()}
        sse = sum((d - means[t] / (1 - sh * c / (1 + c))) ** 2 for t, _, d, sh in rows)
        if best is None or sse < best[0] - 1e-12:
            best = (sse, c, means)
    assert best is not None  # _contentions always yields c = 0
    sse, c, means = best
    s = [x for _, x, _, _ in rows]
    y = [work(d, sh, c) for _, _, d, sh in rows]
    if len(set(s)) > 1:
        slope, intercept = statistics.linear_regression(s, y)
        slope = max(slope, 0.0)
        intercept = statistics.fmean(y) - slope * statistics.fmean(s)
    else:
        slope, intercept = 0.0, statistics.fmean(y)
    return means, c, intercept, slope, math.sqrt(sse / len(rows))


def fit_models(
    runs: list[RunLog],
    max_seqs: int | None = None,
    default_beta: float = DEFAULT_BETA,
) -> LatencyModels:
    trains: list[tuple[str, int, float, float]] = []
    publishes: list[float] = []
    envs: dict[str, list[float]] = {}
    for run in runs:
        env = batch_env(run.events)
        train_shares = iter(_generating_shares(run.events, env))
        for e in phase_records(run.events):
            d = e["end"] - e["start"]
            if e["phase"] == "train":
                profile, seqs = run.profile_of(e["task"]), run.seqs[e["task"]]
                trains.append((profile, seqs, d, next(train_shares)))
            elif e["phase"] == "publish":
                publishes.append(d)
            elif e["phase"] == "rollout":
                # Every batch counts, those that made no tool call as 0 s.
                key = (e["task"], e["version"])
                envs.setdefault(run.profile_of(e["task"]), []).append(
                    _length(env.get(key, []))
                )
    if not trains:
        raise ValueError("no train records to fit")
    by_task, contention, intercept, slope, rmse = _fit_train(trains)
    rollout, diag = fit_rollout(runs, max_seqs, default_beta, contention)
    diag["trains"] = len(trains)
    diag["train_rmse_s"] = rmse
    return LatencyModels(
        rollout=rollout,
        train_intercept_s=intercept,
        train_per_seq_s=slope,
        publish_s=statistics.fmean(publishes) if publishes else 0.0,
        env_by_task={t: statistics.fmean(v) for t, v in envs.items() if any(v)},
        train_by_task=by_task,
        train_contention=contention,
        fit=diag,
    )
