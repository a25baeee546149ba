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

import dataclasses
import json
import math
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from areal.utils import logging

from areal_marlaas.config import MARLaaSConfig, TaskSpec
from areal_marlaas.rundir.reader import rewards_of
from areal_marlaas.trajectory import failure_reason

logger = logging.getLogger("MARLaaSLearning")

# Two-sided 97.5% Student t quantiles (95% CI over seeds).
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 9: 2.262}


def mean_ci(xs: list[float]) -> dict[str, float | None]:
    """Mean, sample sd and the 95% t-interval half-width over ``xs``."""
    n = len(xs)
    mean = statistics.fmean(xs)
    sd = statistics.stdev(xs) if n > 1 else None
    half = _T975.get(n - 1, 1.96) * sd / math.sqrt(n) if sd is not None else None
    return {"mean": mean, "sd": sd, "ci95": half, "n": n}


def prompt_ci(per_prompt: list[float]) -> float:
    """95% normal half-width of a mean over prompts (each a mean of samples)."""
    n = len(per_prompt)
    if n < 2:
        return float("nan")
    return 1.96 * statistics.stdev(per_prompt) / math.sqrt(n)


def eval_spec(task: TaskSpec) -> TaskSpec:
    if task.eval_dataset is None:
        raise ValueError(
            f"task {task.name!r} has no eval_dataset: bench-learning evaluates on "
            "held-out prompts only"
        )
    # A fixed seed: every adapter is scored on the same held-out prompts.
    return dataclasses.replace(task, dataset=task.eval_dataset, seed=0)


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
    ):
        self.cfg = cfg
        self.base_yaml = base_yaml
        self.overrides = [
            o for o in overrides if not o.lstrip("+~").startswith(("tasks.", "tasks="))
        ]
        self.out = out
        self.seeds = seeds
        self.steps = steps
        self.eval_prompts = eval_prompts
        self.eval_samples = eval_samples
        self.work = Path(cfg.cluster.fileroot) / f"{cfg.experiment_name}-learning"
        self.server = None

    # -- runs -------------------------------------------------------------------
    def tasks_for(self, seed: int) -> list[TaskSpec]:
        return [
            dataclasses.replace(t, seed=t.seed + seed, total_steps=self.steps)
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
            ],
        )
        log = self.work / f"{label}.log"
        t0 = time.monotonic()
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
            "wall_s": time.monotonic() - t0,
            "tasks": {
                n: {k: t.get(k) for k in ("status", "steps", "error")}
                for n, t in summary["tasks"].items()
            },
        }

    # -- evaluation -------------------------------------------------------------
    def evaluate(self, engine, task: TaskSpec, adapter: Path, rows, tag: str):
        """Mean reward (accuracy) over ``rows`` x ``eval_samples`` samples."""
        from areal_marlaas.workflows import task_workflow

        name = f"ev{tag}"
        engine.register_task(name, 0, adapter)
        spec = dataclasses.replace(task, name=name)
        workflow, kwargs = task_workflow(spec, self.cfg.tokenizer_path)
        out = engine.rollout_task(rows, workflow, kwargs, self.eval_samples)
        per_prompt, failed = [], 0
        for traj in out:
            if traj is None or failure_reason(traj) is not None:
                failed += 1
                continue
            per_prompt.append(float(traj["rewards"].float().mean()))
        engine.remove_task(name)
        acc = statistics.fmean(per_prompt) if per_prompt else float("nan")
        return {
            "accuracy": acc,
            "ci95_prompts": prompt_ci(per_prompt),
            "prompts": len(per_prompt),
            "failed": failed,
        }

    # -- the whole thing ----------------------------------------------------------
    def run(self) -> dict[str, Any]:
        from areal_marlaas.rollout.engine import MultiLoRAvLLMEngine
        from areal_marlaas.rollout.server import VLLMServer
        from areal_marlaas.tasks import load_task_rows

        self.work.mkdir(parents=True, exist_ok=True)
        evals = {
            t.name: load_task_rows(eval_spec(t))[: self.eval_prompts]
            for t in self.cfg.tasks
        }
        overlaps = {t.name: overlap(t, evals[t.name]) for t in self.cfg.tasks}
        for name, n in overlaps.items():
            if n:
                raise ValueError(
                    f"task {name}: {n} held-out prompts occur in its training set; "
                    "its eval_dataset is not held out"
                )
        server_cfg = dataclasses.replace(self.cfg.server, addresses=[], port=0)
        self.server = VLLMServer(
            self.cfg.vllm.model, self.cfg.vllm, server_cfg, self.work / "vllm.log"
        )
        self.address = self.server.start()
        runs: dict[str, dict[str, Any]] = {}
        try:
            for seed in self.seeds:
                tasks = self.tasks_for(seed)
                for t in tasks:
                    runs[f"s{seed}-alone-{t.name}"] = self.train(
                        f"s{seed}-alone-{t.name}", [t]
                    )
                runs[f"s{seed}-together"] = self.train(f"s{seed}-together", tasks)
            results = self.evaluate_all(runs, evals, MultiLoRAvLLMEngine)
        finally:
            self.server.stop()
        result = {
            "seeds": self.seeds,
            "steps": self.steps,
            "eval_prompts": self.eval_prompts,
            "eval_samples": self.eval_samples,
            "held_out_overlap": overlaps,
            "tasks": {t.name: _describe(t) for t in self.cfg.tasks},
            "runs": runs,
            "results": results,
            "curves": {
                label: {
                    n: rewards_of(r["run_dir"], n)
                    for n in r["tasks"]
                    if r["tasks"][n]["status"] == "done"
                }
                for label, r in runs.items()
            },
        }
        write(result, self.out)
        return result

    def evaluate_all(self, runs, evals, engine_cls) -> dict[str, Any]:
        from areal_marlaas.rollout.gate import without_global_staleness_gate

        engine = engine_cls(without_global_staleness_gate(self.cfg.rollout))
        engine.initialize(addr=[self.address], train_data_parallel_size=1)
        out: dict[str, Any] = {}
        try:
            for i, task in enumerate(self.cfg.tasks):
                rows = evals[task.name]
                first = runs[f"s{self.seeds[0]}-alone-{task.name}"]["run_dir"]
                v0 = Path(first) / "tasks" / task.name / "adapters" / "v0"
                base = self.evaluate(engine, task, v0, rows, f"{i}b")
                entry: dict[str, Any] = {"base": base}
                for cond in ("alone", "together"):
                    per_seed = []
                    for seed in self.seeds:
                        label = (
                            f"s{seed}-alone-{task.name}"
                            if cond == "alone"
                            else f"s{seed}-together"
                        )
                        run = Path(runs[label]["run_dir"])
                        state = json.loads(
                            (run / "tasks" / task.name / "state.json").read_text()
                        )
                        adapter = Path(state["adapter"])
                        tag = f"{i}{cond[0]}{seed}"
                        r = self.evaluate(engine, task, adapter, rows, tag)
                        per_seed.append(
                            {"seed": seed, "version": state["version"], **r}
                        )
                    entry[cond] = {
                        "per_seed": per_seed,
                        **mean_ci([p["accuracy"] for p in per_seed]),
                    }
                out[task.name] = entry
                logger.info(f"evaluated {task.name}: {json.dumps(entry)[:300]}")
        finally:
            engine.destroy()
        return out


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


def format_markdown(result: dict[str, Any]) -> str:
    lines = [
        "# Held-out learning",
        "",
        f"Each task trained {result['steps']} GRPO steps, alone and among the other "
        f"tasks, for seeds {result['seeds']}; held-out accuracy = mean reward over "
        f"{result['eval_prompts']} held-out prompts x {result['eval_samples']} "
        "samples (exact prompt overlap with the training split: "
        f"{result['held_out_overlap']}). Seed columns: mean +- sd [95% t-CI over "
        "seeds]; base: +- the 95% CI over prompts.",
        "",
        "| task | base (v0) | alone, after | together, after "
        "| per seed alone / together |",
        "|---|---|---|---|---|",
    ]
    for name, e in result["results"].items():
        b = e["base"]

        def cell(c):
            sd = "-" if c["sd"] is None else f"{c['sd']:.3f}"
            ci = "-" if c["ci95"] is None else f"{c['ci95']:.3f}"
            return f"{c['mean']:.3f} +- {sd} [+-{ci}]"

        seeds = " / ".join(
            ", ".join(f"{p['accuracy']:.3f}" for p in e[c]["per_seed"])
            for c in ("alone", "together")
        )
        lines.append(
            f"| {name} | {b['accuracy']:.3f} +- {b['ci95_prompts']:.3f} | "
            f"{cell(e['alone'])} | {cell(e['together'])} | {seeds} |"
        )
    lines += ["", "![held-out accuracy](learning.png)", ""]
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["results"])
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.27
    for j, (cond, label) in enumerate(
        (("base", "base (v0)"), ("alone", "alone"), ("together", "among tenants"))
    ):
        means, errs = [], []
        for n in names:
            e = result["results"][n][cond]
            if cond == "base":
                means.append(e["accuracy"])
                errs.append(e["ci95_prompts"])
            else:
                means.append(e["mean"])
                errs.append(e["ci95"] or 0)
        xs = [i + (j - 1) * width for i in range(len(names))]
        ax.bar(xs, means, width, yerr=errs, capsize=3, label=label)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("held-out accuracy")
    ax.set_title(f"after {result['steps']} GRPO steps, seeds {result['seeds']}")
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write(result: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "learning.json").write_text(json.dumps(result, indent=1))
    (out / "learning.md").write_text(format_markdown(result))
    try:
        plot(result, out / "learning.png")
    except Exception as e:  # the numbers are written either way
        logger.error(f"plotting failed: {e}")
