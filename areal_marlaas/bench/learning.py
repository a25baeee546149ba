"""``marlaas bench-learning``: does each task learn, alone and among the other
tenants, on prompts it never trained on?

For every seed: each task trained alone, then all tasks together (same steps,
same task seeds, so a task sees the same prompts in the same order in both), all
attached to one vLLM server the bench starts. Then held-out accuracy (the task's
``eval_dataset``, disjoint from its training set by construction; the bench also
counts exact prompt overlaps as an independent check) of the base model (v0) and
of every final adapter. Writes ``learning.json``, ``learning.md`` and
``learning.png`` to ``--out``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import statistics
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from areal.utils import logging

from areal_marlaas.bench import learning_report
from areal_marlaas.config import MARLaaSConfig, TaskSpec
from areal_marlaas.trajectory import failure_reason

logger = logging.getLogger("MARLaaSLearning")


def prompt_ci(per_prompt: list[float]) -> float:
    """95% normal half-width of a mean over prompts (each a mean of samples)."""
    n = len(per_prompt)
    if n < 2:
        return float("nan")
    return 1.96 * statistics.stdev(per_prompt) / math.sqrt(n)


def prompt_texts(rows: list[dict]) -> set[str]:
    return {json.dumps(r["messages"], sort_keys=True) for r in rows}


def overlap(task: TaskSpec, eval_rows: list[dict]) -> int:
    """Held-out prompts that also occur among the task's training prompts (its
    whole training split, not only the rows drawn): must be 0."""
    from areal_marlaas.tasks import load_task_rows

    # The whole train side: a large draw of a split problem space, or every row
    # of a file.
    size = max(task.dataset.size, 20000) if task.dataset.holdout else 0
    train = dataclasses.replace(
        task, dataset=dataclasses.replace(task.dataset, size=size)
    )
    return len(prompt_texts(load_task_rows(train)) & prompt_texts(eval_rows))


class LearningBench:
    """``base_yaml`` and ``overrides``: what every training run starts from (the
    main YAML without its tasks, and the command line's non-task overrides);
    each run is its own ``marlaas train`` process, so memory is freed between
    runs."""

    def __init__(
        self,
        cfg: MARLaaSConfig,
        base_yaml: str,
        overrides: list[str],
        out: Path,
        seeds: list[int],
        steps: int,
        eval_prompts: int,
        eval_samples: int,
        eval_every: int = 2,
        target_fraction: float = 0.5,
        command: str = "",
    ):
        self.cfg = cfg
        self.command = command  # as the user typed it, for the results
        self.base_yaml = base_yaml
        self.overrides = [
            o for o in overrides if not o.lstrip("+~").startswith(("tasks.", "tasks="))
        ]
        self.out = out
        self.seeds = seeds
        self.steps = steps
        self.eval_prompts = eval_prompts
        self.eval_samples = eval_samples
        self.eval_every = eval_every
        self.target_fraction = target_fraction
        self.work = Path(cfg.cluster.fileroot) / f"{cfg.experiment_name}-learning"
        self.server = None

    # -- runs -------------------------------------------------------------------
    def tasks_for(self, seed: int) -> list[TaskSpec]:
        """The tasks of one seed: a held-out eval (``eval_prompts`` rows, one
        sample each) every ``eval_every`` versions and after the last."""
        return [
            dataclasses.replace(
                t,
                seed=t.seed + seed,
                total_steps=self.steps,
                eval_interval=self.eval_every,
                eval_samples=self.eval_prompts,
            )
            for t in self.cfg.tasks
        ]

    def train(self, label: str, tasks: list[TaskSpec]) -> dict[str, Any]:
        """One ``marlaas train`` process on the bench's server (in-process
        engines: the lightest placement)."""
        from areal_marlaas.bench.run import train_cmd, write_tasks_yaml
        from areal_marlaas.procs import tail

        tasks_yaml = self.work / f"{label}.tasks.yaml"
        write_tasks_yaml(tasks, tasks_yaml)
        cmd = train_cmd(
            self.base_yaml,
            tasks_yaml,
            [
                *self.overrides,
                f"trial_name={label}",
                f"cluster.fileroot={self.work}",
                f"server.addresses=['{self.address}']",
                "scheduler.type=null",
                "fault.keep_adapters=0",  # v0 is the base every curve starts at
            ],
        )
        log = self.work / f"{label}.log"
        t0 = time.monotonic()
        started = time.time()  # the eval records' clock
        with open(log, "wb") as out:
            rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode
        run_dir = self.work / self.cfg.experiment_name / label
        summary_path = run_dir / "summary.json"
        if not summary_path.is_file():
            raise RuntimeError(f"run {label} failed (rc {rc}):\n{tail(log, 30)}")
        summary = json.loads(summary_path.read_text())
        print(f"[learning] {label}: rc {rc}, {time.monotonic() - t0:.0f}s", flush=True)
        return {
            "run_dir": str(run_dir),
            "t0": started,
            "wall_s": time.monotonic() - t0,
            "tasks": {
                n: {k: t.get(k) for k in ("status", "steps", "error")}
                for n, t in summary["tasks"].items()
            },
        }

    # -- evaluation -------------------------------------------------------------
    def evaluate(
        self, engine, task: TaskSpec, adapter: Path, rows, tag: str, samples=None
    ):
        """Mean reward (accuracy) over ``rows`` x ``samples`` samples (default
        ``eval_samples``)."""
        from areal_marlaas.workflows import task_workflow

        name = f"ev{tag}"
        engine.register_task(name, 0, adapter)
        spec = dataclasses.replace(task, name=name)
        workflow, kwargs = task_workflow(spec, self.cfg.tokenizer_path)
        group = self.eval_samples if samples is None else samples
        out = engine.rollout_task(rows, workflow, kwargs, group)
        per_prompt, failed = [], 0
        for traj in out:
            if traj is None or failure_reason(traj) is not None:
                failed += 1
                continue
            per_prompt.append(float(traj["rewards"].float().mean()))
        engine.remove_task(name)
        acc = statistics.fmean(per_prompt) if per_prompt else float("nan")
        mixed = sum(0 < p < 1 for p in per_prompt)
        return {
            "accuracy": acc,
            "ci95_prompts": prompt_ci(per_prompt),
            "prompts": len(per_prompt),
            "failed": failed,
            # Prompts whose samples disagree: a GRPO group with an advantage.
            "mixed_share": mixed / len(per_prompt) if per_prompt else float("nan"),
        }

    @contextlib.contextmanager
    def _server(self) -> Iterator[None]:
        """The bench's vLLM server (at ``self.address``) while the block runs."""
        from areal_marlaas.rollout.server import VLLMServer

        self.work.mkdir(parents=True, exist_ok=True)
        server_cfg = dataclasses.replace(self.cfg.server, addresses=[], port=0)
        self.server = VLLMServer(
            self.cfg.vllm.model, self.cfg.vllm, server_cfg, self.work / "vllm.log"
        )
        self.address = self.server.start()
        try:
            yield
        finally:
            self.server.stop()

    @contextlib.contextmanager
    def _engine(self) -> Iterator[Any]:
        """A multi-LoRA engine on the bench's server, for scoring adapters."""
        from areal_marlaas.rollout.engine import MultiLoRAvLLMEngine
        from areal_marlaas.rollout.gate import without_global_staleness_gate

        engine = MultiLoRAvLLMEngine(without_global_staleness_gate(self.cfg.rollout))
        engine.initialize(addr=[self.address], train_data_parallel_size=1)
        try:
            yield engine
        finally:
            engine.destroy()

    def provenance(self) -> dict[str, str]:
        from areal_marlaas.bench.machine import describe, machine

        return {"command": self.command, "machine": describe(machine())}

    # -- which tasks can learn ------------------------------------------------------
    def probe(self) -> dict[str, Any]:
        """The base model on each task's *training* prompts (the test split stays
        unseen): accuracy, and the share of prompts whose samples disagree, the
        groups where GRPO has an advantage to learn from. Writes ``base.json``
        and ``base.md``."""
        from areal_marlaas.tasks import load_task_rows

        out: dict[str, Any] = {}
        with self._server():
            # A fresh LoRA (B = 0) is the base model: one 1-step run makes one.
            first = dataclasses.replace(self.cfg.tasks[0], total_steps=1)
            run = self.train("probe", [first])
            v0 = Path(run["run_dir"]) / "tasks" / first.name / "adapters" / "v0"
            with self._engine() as engine:
                for i, task in enumerate(self.cfg.tasks):
                    spec = dataclasses.replace(task, seed=0)
                    rows = load_task_rows(spec)[: self.eval_prompts]
                    t0 = time.monotonic()
                    r = self.evaluate(engine, task, v0, rows, f"p{i}")
                    out[task.name] = {
                        **r,
                        "seconds": time.monotonic() - t0,
                        "task": _describe(task),
                    }
                    logger.info(f"base {task.name}: {json.dumps(r)}")
        result = {
            **self.provenance(),
            "eval_prompts": self.eval_prompts,
            "eval_samples": self.eval_samples,
            "tasks": out,
        }
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "base.json").write_text(json.dumps(result, indent=1))
        (self.out / "base.md").write_text(learning_report.format_probe(result))
        return result

    # -- the whole thing ----------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Per seed: each task alone (one after another: the sequential
        baseline), then all together; a held-out eval every ``eval_every``
        versions in every run; the base (v0) scored on the same eval rows."""
        from transformers import AutoTokenizer

        from areal_marlaas.bench.learning_analysis import (
            alone_label,
            analyse,
            audit,
            together_label,
        )
        from areal_marlaas.rundir.reader import read_jsonl
        from areal_marlaas.tasks import load_eval_rows

        tokenizer = AutoTokenizer.from_pretrained(self.cfg.tokenizer_path)
        # Every seed's eval rows, drawn as its runs draw them.
        eval_rows = {
            seed: {t.name: load_eval_rows(t, tokenizer) for t in self.tasks_for(seed)}
            for seed in self.seeds
        }
        overlaps = {
            t.name: sum(overlap(t, eval_rows[s][t.name]) for s in self.seeds)
            for t in self.cfg.tasks
        }
        for name, n in overlaps.items():
            if n:
                raise ValueError(
                    f"task {name}: {n} held-out prompts occur in its training set; "
                    "its eval_dataset is not held out"
                )
        runs: dict[str, dict[str, Any]] = {}
        with self._server():
            for seed in self.seeds:
                tasks = self.tasks_for(seed)
                for t in tasks:
                    label = alone_label(seed, t.name)
                    runs[label] = self.train(label, [t])
                runs[together_label(seed)] = self.train(together_label(seed), tasks)
            bases = self.evaluate_bases(runs, eval_rows)
        for r in runs.values():
            r["evals"] = read_jsonl(Path(r["run_dir"]) / "evals.jsonl")
            r["steps"] = read_jsonl(Path(r["run_dir"]) / "steps.jsonl")
        names = [t.name for t in self.cfg.tasks]
        analysis = analyse(names, self.seeds, runs, bases, self.target_fraction)
        limit = self.cfg.audit.limit(self.cfg.vllm.dtype, self.cfg.actor.dtype)
        result = {
            **self.provenance(),
            "seeds": self.seeds,
            "steps": self.steps,
            "eval_every": self.eval_every,
            "eval_prompts": self.eval_prompts,
            "target_fraction": self.target_fraction,
            "held_out_overlap": overlaps,
            "tasks": {t.name: _describe(t) for t in self.cfg.tasks},
            "bases": bases,
            "runs": {
                label: {k: v for k, v in r.items() if k not in ("evals", "steps")}
                for label, r in runs.items()
            },
            "audit": audit([s for r in runs.values() for s in r["steps"]], limit),
            **analysis,
        }
        learning_report.write(result, self.out)
        return result

    def evaluate_bases(self, runs, eval_rows) -> dict[int, dict[str, float]]:
        """The base model (each task's v0: a fresh LoRA, B = 0) on each seed's
        eval rows, one sample each, as the runs' evals score their versions."""
        from areal_marlaas.bench.learning_analysis import alone_label

        bases: dict[int, dict[str, float]] = {}
        with self._engine() as engine:
            for seed in self.seeds:
                bases[seed] = {}
                for i, task in enumerate(self.tasks_for(seed)):
                    run = Path(runs[alone_label(seed, task.name)]["run_dir"])
                    v0 = run / "tasks" / task.name / "adapters" / "v0"
                    rows = eval_rows[seed][task.name]
                    r = self.evaluate(engine, task, v0, rows, f"b{seed}x{i}", 1)
                    bases[seed][task.name] = r["accuracy"]
                    logger.info(f"base {task.name} seed {seed}: {json.dumps(r)}")
        return bases


def _describe(t: TaskSpec) -> dict[str, Any]:
    return {
        "kind": t.kind,
        "train": dataclasses.asdict(t.dataset),
        "eval": dataclasses.asdict(t.eval_dataset) if t.eval_dataset else None,
        "batch_size": t.batch_size,
        "n_samples": t.n_samples,
        "max_new_tokens": t.max_new_tokens,
        "lr": t.lr,
        "temperature": t.temperature,
    }
