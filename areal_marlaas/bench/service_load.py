"""``marlaas bench-service``: fine-tuning jobs arriving as a Poisson process at a
live ``marlaas service``, sent through the official ``openai`` SDK like a tenant
sends them; TTFS, TPTS and throughput of the async service against a FIFO one
(``service.max_running_jobs=1``: one job at a time, in arrival order).

Metrics per run (docs/bench.md#service-under-load):
- TTFS: a job's first committed step - its creation (the service's ``ttfs_s``).
- TPTS: the time between a job's consecutive committed steps (``committed_at``
  of its ``metrics`` events), pooled over the run's jobs.
- throughput: committed steps / (last step - first arrival), per hour.
- step time: the mean ``train_s`` of the run's steps (what "TTFS <= 2 step
  times" is measured in).
- TTFS parts (mean per job): ``waiting_s`` (created -> started, its first
  rollout: the service's job queue, the hand-over and admission; whole seconds,
  the job object's resolution), ``first_batch_s`` (started -> its first batch
  queued for the trainer: rollout, rewards), ``queue_s`` (in the training
  queue) and ``train_s`` (the step).
"""

from __future__ import annotations

import json
import logging
import random
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import httpx

from areal_marlaas.bench.fairness import fairness
from areal_marlaas.bench.run_metrics import percentile
from areal_marlaas.config.bench_service import ServiceLoadConfig
from areal_marlaas.procs import stop_group, tail

logger = logging.getLogger("MARLaaSBenchService")

TERMINAL = ("succeeded", "failed", "cancelled")
BASE_MODEL = "SmolLM2-135M-Instruct"

GRADERS: dict[str, dict[str, Any]] = {
    "string_check": {
        "type": "string_check",
        "name": "has_answer",
        "input": "{{ sample.output_text }}",
        "reference": "{{ item.answer }}",
        "operation": "like",
    },
    "text_similarity": {
        "type": "text_similarity",
        "name": "close",
        "input": "{{ sample.output_text }}",
        "reference": "The answer is {{ item.answer }}.",
        "evaluation_metric": "fuzzy_match",
    },
}


def arithmetic_lines(n: int, seed: int) -> bytes:
    """``n`` training lines (chat messages + the answer the grader reads)."""
    out = []
    for i in range(n):
        a, b = (seed * 7 + i * 3) % 9 + 1, (seed + i * 5) % 9 + 1
        out.append(
            {
                "messages": [
                    {"role": "user", "content": f"What is {a} + {b}? Reply briefly."}
                ],
                "answer": str(a + b),
            }
        )
    return "".join(json.dumps(r) + "\n" for r in out).encode()


def arrival_times(n: int, rate_per_min: float, seed: int) -> list[float]:
    """Offsets (s) of ``n`` Poisson arrivals at ``rate_per_min``: the first at 0,
    then exponential gaps. The unit gaps depend on ``seed`` only, so two rates
    with one seed differ by a scale and two services see the same times."""
    rng = random.Random(seed)
    out, t = [0.0], 0.0
    for _ in range(n - 1):
        t += rng.expovariate(1.0) * 60.0 / rate_per_min
        out.append(t)
    return out


@dataclass(frozen=True)
class JobPlan:
    """One job of a run: who sends it and how large it is."""

    tenant: str
    weight: float
    batch_size: int
    compute_multiplier: float
    lines: int
    tool_latency_s: float = 0.0


def job_plan(load: ServiceLoadConfig, seed: int) -> list[JobPlan]:
    """A run's jobs in arrival order. Without ``load.tenants``, ``load.jobs`` jobs
    of one tenant ``bench``; with them, every tenant's jobs in a shuffle seeded by
    ``seed`` (each service sees the same order). Every job has the same number of
    batches: its lines scale with its batch size."""
    batches = load.lines_per_job // load.batch_size
    if not load.tenants:
        one = JobPlan(
            "bench", 1.0, load.batch_size, load.compute_multiplier, load.lines_per_job
        )
        return [one] * load.jobs
    jobs: list[JobPlan] = []
    for t in load.tenants:
        size = t.batch_size or load.batch_size
        mult = t.compute_multiplier or load.compute_multiplier
        one = JobPlan(t.name, t.weight, size, mult, batches * size, t.tool_latency_s)
        jobs += [one] * t.jobs
    random.Random(seed).shuffle(jobs)
    return jobs


def tenant_metrics(
    jobs: list[dict[str, Any]],
    events: Iterable[Mapping[str, Any]],
    weights: Mapping[str, float],
) -> dict[str, Any]:
    """Per tenant, from its jobs (``tenant``, ``task``, ``ttfs_s``, ``train_s``
    and the job object's ``usage``): TTFS p50/p95, its mean step, TTFS p95 in its
    own steps, trainer-seconds and generated tokens with its share of each (the
    trainer's weighted); and the trainer's fairness over the window in which
    every tenant was backlogged, from the run directory's interval ``events``
    (``bench.fairness``)."""
    by: dict[str, list[dict[str, Any]]] = {}
    for j in jobs:
        by.setdefault(j["tenant"], []).append(j)

    def usage(j: dict[str, Any], key: str) -> float:
        return float((j.get("usage") or {}).get(key) or 0)

    trainer = {t: sum(usage(j, "trainer_s") for j in js) for t, js in by.items()}
    tokens = {t: sum(usage(j, "generated_tokens") for j in js) for t, js in by.items()}
    weighted = {t: trainer[t] / weights.get(t, 1.0) for t in by}
    total_w, total_tok = sum(weighted.values()), sum(tokens.values())
    rows = {}
    for t, js in by.items():
        known = [j["ttfs_s"] for j in js if j.get("ttfs_s") is not None]
        steps = [s for j in js for s in j.get("train_s") or []]
        step_s = statistics.fmean(steps) if steps else None
        p95 = percentile(known, 95)
        rows[t] = {
            "weight": weights.get(t, 1.0),
            "jobs": len(js),
            "ttfs_p50_s": percentile(known, 50),
            "ttfs_p95_s": p95,
            "step_s": step_s,
            "ttfs_p95_in_steps": p95 / step_s if p95 and step_s else None,
            "trainer_s": trainer[t],
            "generated_tokens": tokens[t],
            "weighted_trainer_share": weighted[t] / total_w if total_w else None,
            "token_share": tokens[t] / total_tok if total_tok else None,
        }
    tenant_of = {j["task"]: j["tenant"] for j in jobs if j.get("task")}
    return {"tenants": rows, "fairness": fairness(events, tenant_of, weights)}


def run_metrics(
    jobs: list[dict[str, Any]], first_arrival: float | None
) -> dict[str, Any]:
    """The load metrics of one run. ``jobs``: per job, in arrival order,
    ``{"status", "ttfs_s", "commits": [t, ...], "train_s": [s, ...]}``;
    ``first_arrival``: the wall time the first job was created (None: none was)."""
    ttfs = [j["ttfs_s"] for j in jobs]
    known = [t for t in ttfs if t is not None]
    gaps = [b - a for j in jobs for a, b in pairwise(j["commits"])]
    train = [s for j in jobs for s in j["train_s"]]
    commits = [t for j in jobs for t in j["commits"]]
    steps = len(commits)
    # A commit means a job was created, so first_arrival is set.
    window = (
        max(commits) - first_arrival if commits and first_arrival is not None else None
    )
    step_s = statistics.fmean(train) if train else None
    ttfs_p95 = percentile(known, 95)
    tpts_p50 = percentile(gaps, 50)
    parts = [ttfs_parts(j) for j in jobs]
    parts = [x for x in parts if x is not None]
    jct = job_completion_times(jobs)
    return {
        "jobs": len(jobs),
        "succeeded": sum(j["status"] == "succeeded" for j in jobs),
        "steps": steps,
        "window_s": window,
        "steps_per_hour": steps / window * 3600 if window else None,
        "ttfs_p50_s": percentile(known, 50),
        "ttfs_p95_s": ttfs_p95,
        "ttfs_max_s": max(known, default=None),
        "tpts_p50_s": tpts_p50,
        "tpts_p95_s": percentile(gaps, 95),
        "step_s": step_s,
        "ttfs_p95_in_steps": ttfs_p95 / step_s if ttfs_p95 and step_s else None,
        "ttfs_p95_in_tpts": ttfs_p95 / tpts_p50 if ttfs_p95 and tpts_p50 else None,
        "jct_p50_s": percentile(jct, 50),
        "jct_p95_s": percentile(jct, 95),
        "ttfs_by_arrival": ttfs,
        "ttfs_parts": {k: statistics.fmean(x[k] for x in parts) for k in TTFS_PARTS}
        if parts
        else None,
    }


TTFS_PARTS = ("waiting_s", "first_batch_s", "queue_s", "train_s")


def job_completion_times(jobs: list[dict[str, Any]]) -> list[float]:
    """Each job's creation -> last committed step (its first commit minus its
    TTFS is its creation), for the jobs with both."""
    return [
        j["commits"][-1] - (j["commits"][0] - j["ttfs_s"])
        for j in jobs
        if j.get("commits") and j.get("ttfs_s") is not None
    ]


def ttfs_parts(job: dict[str, Any]) -> dict[str, float] | None:
    """Where a job's TTFS went (``TTFS_PARTS``, summing to ``ttfs_s``), from its
    ``waiting_s`` (created -> started) and its first step's ``queue_wait_s`` and
    ``train_s``; None when one is unknown."""
    ttfs, wait = job.get("ttfs_s"), job.get("waiting_s")
    queue, train = job.get("queue_wait_s") or [], job.get("train_s") or []
    if ttfs is None or wait is None or not queue or not train:
        return None
    return {
        "waiting_s": wait,
        "first_batch_s": ttfs - wait - queue[0] - train[0],
        "queue_s": queue[0],
        "train_s": train[0],
    }


class ServiceProcess:
    """``marlaas service --config X.yaml overrides`` in its own process session,
    like an operator runs it; ``stop`` ends it and, through its reaper, its vLLM
    server."""

    def __init__(self, root: Path, config: str, overrides: list[str], port: int):
        self.root = Path(root)
        self.config = config
        self.port = port
        self.overrides = [f"service.root={root}", f"service.port={port}", *overrides]
        self.proc: subprocess.Popen | None = None
        self.log = self.root / "service.out"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, timeout: float = 600.0) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "areal_marlaas.cli", "service"]
                + ["--config", self.config, *self.overrides],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        assert self.proc is not None  # started above
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the service exited:\n{self.tail()}")
            try:
                url = f"http://127.0.0.1:{self.port}/health"
                if httpx.get(url, timeout=2).is_success:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        raise TimeoutError(f"the service did not come up:\n{self.tail()}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        assert self.proc is not None  # started
        stop_group(self.proc, graceful=False)

    def stop(self) -> None:
        """SIGTERM to the service alone (it stops its trainer and server), then
        SIGKILL to its whole group after 300 s."""
        if self.alive():
            assert self.proc is not None  # alive() checked it
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(300)
            except subprocess.TimeoutExpired:
                stop_group(self.proc, graceful=False)

    def tail(self, n: int = 60) -> str:
        return tail(self.log, n)


def job_steps(client, job_id: str) -> dict[str, list[float]]:
    """A job's committed steps from its ``metrics`` events (every page), in step
    order: ``commits`` (commit times), ``train_s`` and ``queue_wait_s``."""
    steps: dict[int, dict[str, Any]] = {}
    after = None
    while True:
        page = client.fine_tuning.jobs.list_events(job_id, limit=100, after=after)
        for e in page.data:
            data = e.data or {}
            own = data.get("marlaas") or {}
            if e.type == "metrics" and "committed_at" in own:
                steps[data["step"]] = own
        if not page.has_more or not page.data:
            break
        after = page.data[-1].id
    ordered = [steps[s] for s in sorted(steps)]

    def each(key: str) -> list[float]:
        return [float(d[key]) for d in ordered if d.get(key) is not None]

    return {
        "commits": each("committed_at"),
        "train_s": each("train_s"),
        "queue_wait_s": each("queue_wait_s"),
    }
