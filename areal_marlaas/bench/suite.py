"""``marlaas bench``: one workload under every scheduling mode, ablations and a
concurrency sweep, in one invocation.

The config is a normal ``marlaas train`` YAML plus a ``bench:`` section
(``BenchConfig``); ``bench.*`` overrides go to the bench, every other override to
each training run. Per placement the bench starts one vLLM server itself
(disaggregated: server on ``bench.server_cpus``, trainer on ``bench.trainer_cpus``;
collocated: both on ``bench.collocated_cpus``), warms it up, and runs each
configuration as its own ``marlaas train`` subprocess attached to it
(``scheduler.type=null``: in-process engines, one process per run so memory is
freed between runs), sampling utilization while it goes. A failed run is
reported, not fatal.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
from areal.utils import logging
from omegaconf import OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from areal_marlaas.bench.metrics import load_run, ratios, run_metrics
from areal_marlaas.bench.sampler import UtilizationSampler
from areal_marlaas.config import (
    MARLaaSConfig,
    TaskSpec,
    _compose_yaml,
    _resolve_tasks_path,
    load_config,
    parse_args,
)
from areal_marlaas.errors import ConfigError
from areal_marlaas.metrics.report import phase_stats

logger = logging.getLogger("MARLaaSBench")

MODES = ("async", "sync", "sequential", "collocated")
# ablation -> (mode, extra train overrides)
ABLATIONS: dict[str, tuple[str, dict[str, str]]] = {
    "no_multi_lora": ("async", {"scheduler.multi_lora": "false"}),
}
PLACEMENTS = ("disaggregated", "collocated")
OUT_LIMIT_BYTES = 3 * 2**20


_MACHINE_KEYS = ("cluster.fileroot=", "server.addresses=")


def portable_overrides(cmd: list[str]) -> list[str]:
    """The ``key=value`` overrides of a run command that say how it ran, not where."""
    return [a for a in cmd if "=" in a and not a.startswith(_MACHINE_KEYS)]


@dataclass
class BenchConfig:
    """What ``marlaas bench`` runs (the ``bench:`` section of the config)."""

    task: str = field(
        default="",
        metadata={
            "help": "Task (by name, from the tasks YAML) replicated `replicas` "
            "times as <name>_<i> with seed + i; empty = the task mix as given."
        },
    )
    replicas: int = field(
        default=8,
        metadata={"help": "Tenants in the mode runs; 0 = as many as the tasks."},
    )
    steps: int = field(
        default=3, metadata={"help": "Training steps per task; 0 = the tasks' own."}
    )
    modes: list[str] = field(
        default_factory=lambda: list(MODES),
        metadata={"help": f"Scheduler modes to run, of {list(MODES)}."},
    )
    ablations: list[str] = field(
        default_factory=lambda: ["no_multi_lora"],
        metadata={
            "help": f"Ablation runs, of {list(ABLATIONS)} (no_multi_lora: async "
            "with one adapter per server batch). Without asynchrony = mode sync."
        },
    )
    concurrency: list[int] = field(
        default_factory=lambda: [1, 2, 4, 8],
        metadata={"help": "Tenant counts of the sweep (empty = no sweep)."},
    )
    sweep_mode: str = field(
        default="async", metadata={"help": "Scheduler mode of the sweep runs."}
    )
    out: str = field(
        default="docs/results/bench",
        metadata={"help": "Where bench.json, bench.md, PNGs and run logs go."},
    )
    work_dir: str = field(
        default="",
        metadata={
            "help": "Run directories and server logs; empty = "
            "<cluster.fileroot>/<experiment_name>-bench."
        },
    )
    server_cpus: str = field(
        default="0",
        metadata={"help": "Disaggregated: cores of the vLLM server (affinity, OMP)."},
    )
    trainer_cpus: str = field(
        default="1", metadata={"help": "Disaggregated: cores of the trainer."}
    )
    collocated_cpus: str = field(
        default="0-1",
        metadata={"help": "Collocated: cores the server and the trainer share."},
    )
    warmup_requests: int = field(
        default=8, metadata={"help": "Completions sent to each new server first."}
    )
    warmup_run: bool = field(
        default=True,
        metadata={"help": "A discarded 1-task 1-step training run before the first."},
    )
    sample_interval_s: float = field(
        default=0.5, metadata={"help": "Utilization sampling period."}
    )
    run_timeout_s: float = field(
        default=3600.0, metadata={"help": "A run still going after this fails."}
    )
    keep_adapters: bool = field(
        default=False,
        metadata={"help": "Keep each run's adapter folders in the work dir."},
    )

    def __post_init__(self):
        for m in self.modes:
            if m not in MODES:
                raise ConfigError(
                    f"bench.modes: unknown mode {m!r}; use some of {list(MODES)}."
                )
        for a in self.ablations:
            if a not in ABLATIONS:
                raise ConfigError(
                    f"bench.ablations: unknown ablation {a!r}; use some of "
                    f"{list(ABLATIONS)} (without asynchrony is mode sync)."
                )
        if self.replicas < 0:
            raise ConfigError(f"bench.replicas must be >= 0, got {self.replicas}.")
        if self.task and self.replicas < 1:
            raise ConfigError("bench.replicas must be >= 1 when bench.task is set.")
        if self.steps < 0:
            raise ConfigError(f"bench.steps must be >= 0, got {self.steps}.")
        if any(int(c) < 1 for c in self.concurrency):
            raise ConfigError(
                f"bench.concurrency: tenant counts must be >= 1, got "
                f"{list(self.concurrency)}."
            )
        if self.concurrency and self.sweep_mode not in MODES:
            raise ConfigError(
                f"bench.sweep_mode: unknown mode {self.sweep_mode!r}; use one of "
                f"{list(MODES)}."
            )
        if not (self.modes or self.ablations or self.concurrency):
            raise ConfigError(
                "bench: nothing to run; give bench.modes, bench.ablations or "
                "bench.concurrency."
            )
        if self.sample_interval_s <= 0:
            raise ConfigError("bench.sample_interval_s must be > 0.")
        if self.run_timeout_s <= 0:
            raise ConfigError("bench.run_timeout_s must be > 0.")


@dataclass
class RunPlan:
    label: str
    mode: str
    placement: str
    tasks: list[TaskSpec]
    group: str  # mode | ablation | sweep
    overrides: dict[str, str] = field(default_factory=dict)

    @property
    def tenants(self) -> int:
        return len(self.tasks)


# -- config ---------------------------------------------------------------------
def load_bench_config(
    argv: list[str],
) -> tuple[BenchConfig, MARLaaSConfig, str, list[str]]:
    """``--config X.yaml [--tasks T.yaml] [bench.k=v ...] [k=v ...]`` -> the bench
    settings, the validated training config, the training YAML (the config without
    its ``bench`` section, tasks resolved to an absolute path) and the training
    overrides."""
    config_file, tasks_arg, overrides = parse_args(argv)
    if not config_file.is_file():
        raise ConfigError(f"--config: {config_file} does not exist.")
    raw = _compose_yaml(config_file)
    bench_overrides = [o for o in overrides if o.lstrip("+").startswith("bench.")]
    train_overrides = [o for o in overrides if o not in bench_overrides]
    with open_dict(raw):
        section = raw.pop("bench", None) or {}
        if raw.get("tasks_file"):
            raw.tasks_file = str(
                _resolve_tasks_path(str(raw.tasks_file), config_file).absolute()
            )
    try:
        merged = OmegaConf.merge(OmegaConf.structured(BenchConfig), section)
        # `bench.task=` means the empty string, not null
        merged.merge_with_dotlist(
            [
                o.lstrip("+")[len("bench.") :] + ("''" if o.endswith("=") else "")
                for o in bench_overrides
            ]
        )
        bench = OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None)
        raise ConfigError(
            f"bench.{key or ''}: {str(e).splitlines()[0]}"
            if key
            else f"bench: {str(e).splitlines()[0]}"
        ) from e
    assert isinstance(bench, BenchConfig)
    tmp = Path(tempfile.mkdtemp(prefix="marlaas-bench-"))
    base = tmp / "train.yaml"
    OmegaConf.save(raw, base)
    args = ["--config", str(base)]
    if tasks_arg:
        args += ["--tasks", str(_resolve_tasks_path(tasks_arg, config_file).absolute())]
    cfg, _ = load_config([*args, *train_overrides])
    return bench, cfg, str(base), [*args[2:], *train_overrides]


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


def plan_runs(bench: BenchConfig, cfg: MARLaaSConfig) -> list[RunPlan]:
    n = bench.replicas or len(cfg.tasks)
    tasks = workload(bench, cfg, n)
    plans = []
    for mode in bench.modes:
        placement = "collocated" if mode == "collocated" else "disaggregated"
        plans.append(RunPlan(mode, mode, placement, tasks, "mode"))
    for name in bench.ablations:
        mode, extra = ABLATIONS[name]
        plans.append(
            RunPlan(f"{mode}_{name}", mode, "disaggregated", tasks, "ablation", extra)
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
    return plans


def sweep_labels(bench: BenchConfig, cfg: MARLaaSConfig) -> dict[int, str]:
    n = bench.replicas or len(cfg.tasks)
    out = {}
    for k in sorted({int(c) for c in bench.concurrency}):
        same = k == n and bench.sweep_mode in bench.modes
        out[k] = bench.sweep_mode if same else f"{bench.sweep_mode}_c{k}"
    return out


def count_cpus(spec: str) -> int:
    """Cores in a list like ``0``, ``0,1`` or ``0-3``."""
    n = 0
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            a, b = part.split("-", 1)
            n += int(b) - int(a) + 1
        else:
            n += 1
    return n


def placement_cpus(bench: BenchConfig, placement: str) -> dict[str, Any]:
    if placement == "collocated":
        c = count_cpus(bench.collocated_cpus)
        return {
            "server_cpus": bench.collocated_cpus,
            "trainer_cpus": bench.collocated_cpus,
            "cores": (c, c, c),
        }
    s, t = count_cpus(bench.server_cpus), count_cpus(bench.trainer_cpus)
    return {
        "server_cpus": bench.server_cpus,
        "trainer_cpus": bench.trainer_cpus,
        "cores": (s, t, s + t),
    }


# -- running --------------------------------------------------------------------
def warm_up(address: str, n: int, max_tokens: int = 16) -> None:
    """A few concurrent base-model completions, so the first run does not pay for
    the server's first batches."""
    if n <= 0:
        return
    model = requests.get(f"http://{address}/v1/models", timeout=30).json()["data"][0][
        "id"
    ]

    def one(i: int) -> None:
        requests.post(
            f"http://{address}/v1/completions",
            json={"model": model, "prompt": f"{i} + {i} =", "max_tokens": max_tokens},
            timeout=300,
        )

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()


def write_tasks_yaml(tasks: list[TaskSpec], path: Path) -> None:
    OmegaConf.save(
        OmegaConf.create({"tasks": [dataclasses.asdict(t) for t in tasks]}), path
    )


def _compact_event(e: dict[str, Any], t0: float) -> dict[str, Any]:
    out = dict(e)
    for k in ("start", "end", "t"):
        if isinstance(out.get(k), int | float):
            out[k] = round(out[k] - t0, 3)
    return out


_STEP_KEYS = (
    "task",
    "version",
    "reward_mean",
    "staleness_max",
    "n_trajectories",
    "queue_wait_s",
    "train_s",
    "t_commit",
)


def compact_run(
    run: dict[str, Any], samples: list[dict[str, Any]], dest: Path, max_samples: int
) -> float:
    """Write the run's logs to ``dest`` with times relative to the run's first
    phase record (rounded to ms) and samples thinned to ``max_samples``; returns
    the time origin."""
    dest.mkdir(parents=True, exist_ok=True)
    starts = [e["start"] for e in run["events"] if "phase" in e]
    t0 = min(starts) if starts else 0.0
    with open(dest / "events.jsonl", "w") as f:
        for e in run["events"]:
            f.write(json.dumps(_compact_event(e, t0)) + "\n")
    with open(dest / "steps.jsonl", "w") as f:
        for s in run["steps"]:
            rec = {k: s.get(k) for k in _STEP_KEYS}
            rec["t_commit"] = round(s["t_commit"] - t0, 3)
            for k in ("reward_mean", "queue_wait_s", "train_s"):
                if isinstance(rec[k], float):
                    rec[k] = round(rec[k], 4)
            f.write(json.dumps(rec) + "\n")
    summary = {k: v for k, v in run["summary"].items() if k != "run_dir"}
    (dest / "summary.json").write_text(json.dumps(summary, indent=1))
    stride = max(1, -(-len(samples) // max_samples))
    with open(dest / "samples.jsonl", "w") as f:
        for s in samples[::stride]:
            rec = {k: round(v, 3) for k, v in s.items()}
            rec["t"] = round(s["t"] - t0, 3)
            f.write(json.dumps(rec) + "\n")
    return t0


class Bench:
    def __init__(
        self,
        bench: BenchConfig,
        cfg: MARLaaSConfig,
        base_yaml: str,
        train_args: list[str],
    ):
        self.bench = bench
        self.cfg = cfg
        self.base_yaml = base_yaml
        # --tasks of the command line is replaced by each run's own tasks file.
        args = list(train_args)
        if "--tasks" in args:
            i = args.index("--tasks")
            del args[i : i + 2]
        self.train_overrides = [
            a for a in args if not a.lstrip("+~").startswith(("tasks.", "tasks="))
        ]
        self.work = Path(
            bench.work_dir
            or Path(cfg.cluster.fileroot) / f"{cfg.experiment_name}-bench"
        )
        self.out = Path(bench.out)
        self.plans = plan_runs(bench, cfg)
        self.kv_bytes = task_kv_estimator(cfg)

    def train_command(self, plan: RunPlan, address: str, tasks_yaml: Path) -> list:
        cpus = placement_cpus(self.bench, plan.placement)
        overrides = {
            "experiment_name": self.cfg.experiment_name,
            "trial_name": plan.label,
            "cluster.fileroot": str(self.work),
            "server.addresses": f"['{address}']",
            "scheduler.type": "null",
            "scheduler.mode": plan.mode,
            "scheduler.trainer_cpus": cpus["trainer_cpus"],
            **plan.overrides,
        }
        return [
            sys.executable,
            "-m",
            "areal_marlaas.train",
            "--config",
            self.base_yaml,
            "--tasks",
            str(tasks_yaml),
            *self.train_overrides,
            *(f"{k}={v}" for k, v in overrides.items()),
        ]

    def start_server(self, placement: str):
        from areal_marlaas.rollout.server import VLLMServer

        cpus = placement_cpus(self.bench, placement)["server_cpus"]
        changes: dict[str, Any] = {
            "addresses": [],
            "port": 0,
            "cpu_omp_threads_bind": cpus,
        }
        if any(f.name == "cpu_affinity" for f in dataclasses.fields(self.cfg.server)):
            changes["cpu_affinity"] = cpus
        server_cfg = dataclasses.replace(self.cfg.server, **changes)
        server = VLLMServer(
            self.cfg.vllm.model,
            self.cfg.vllm,
            server_cfg,
            self.work / f"vllm_{placement}.log",
        )
        server.start()
        return server

    def execute(self, plan: RunPlan, server, out_dir: Path | None) -> dict[str, Any]:
        """One ``marlaas train`` subprocess, sampled; its metrics (or error)."""
        tasks_yaml = self.work / f"{plan.label}.tasks.yaml"
        write_tasks_yaml(plan.tasks, tasks_yaml)
        cmd = self.train_command(plan, server.address, tasks_yaml)
        log_path = self.work / f"{plan.label}.log"
        run_dir = self.work / self.cfg.experiment_name / plan.label
        shutil.rmtree(run_dir, ignore_errors=True)
        result: dict[str, Any] = {
            "label": plan.label,
            "mode": plan.mode,
            "placement": plan.placement,
            "group": plan.group,
            "tenants": plan.tenants,
            "overrides": plan.overrides,
            "tasks": [
                {
                    "name": t.name,
                    "batch_size": t.batch_size,
                    "n_samples": t.n_samples,
                    "max_new_tokens": t.max_new_tokens,
                    "max_prompt_tokens": t.max_prompt_tokens,
                    "total_steps": t.total_steps,
                    "priority": t.priority,
                    "kv_bytes": self.kv_bytes(t),
                }
                for t in plan.tasks
            ],
            # The run's settings, without this machine's paths and ports.
            "command": " ".join(["marlaas train", *portable_overrides(cmd)]),
        }
        t_start = time.monotonic()
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        sampler = UtilizationSampler(
            server.process.pid if server.process else None,
            proc.pid,
            server.address,
            self.bench.sample_interval_s,
        ).start()
        try:
            rc = proc.wait(timeout=self.bench.run_timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            rc = None
        except BaseException:  # Ctrl-C: its own session would outlive the bench
            _kill_group(proc)
            sampler.stop()
            raise
        samples = sampler.stop()
        result["process_s"] = time.monotonic() - t_start
        result["returncode"] = rc
        run = load_run(run_dir)
        cores = placement_cpus(self.bench, plan.placement)["cores"]
        result["cores"] = {"server": cores[0], "trainer": cores[1], "total": cores[2]}
        ok = rc == 0 and bool(run["steps"])
        result["status"] = "ok" if ok else ("timeout" if rc is None else "failed")
        if not ok:
            result["log_tail"] = _tail(log_path, 25)
        if run["events"]:
            result["metrics"] = run_metrics(run, samples, cores)
            result["phases"] = phase_stats(run_dir)
            if out_dir is not None:
                compact_run(run, samples, out_dir / "runs" / plan.label, 400)
        if not self.bench.keep_adapters:
            shutil.rmtree(run_dir / "tasks", ignore_errors=True)
        return result

    def run(self) -> dict[str, Any]:
        self.work.mkdir(parents=True, exist_ok=True)
        self.out.mkdir(parents=True, exist_ok=True)
        # Each run gets its tasks as its own --tasks file.
        base = OmegaConf.load(self.base_yaml)
        with open_dict(base):
            base.pop("tasks", None)
            base.pop("tasks_file", None)
        OmegaConf.save(base, self.work / "train.yaml")
        self.base_yaml = str(self.work / "train.yaml")
        t0 = time.monotonic()
        results: dict[str, dict[str, Any]] = {}
        total = len(self.plans)
        done = 0
        servers: dict[str, float | None] = {}
        for placement in PLACEMENTS:
            plans = [p for p in self.plans if p.placement == placement]
            if not plans:
                continue
            print(f"[bench] {placement}: starting the vLLM server", flush=True)
            try:
                server = self.start_server(placement)
            except Exception as e:
                logger.error(f"{placement} server failed to start: {e}")
                for p in plans:
                    done += 1
                    results[p.label] = {
                        "label": p.label,
                        "mode": p.mode,
                        "placement": placement,
                        "group": p.group,
                        "tenants": p.tenants,
                        "status": "failed",
                        "error": f"server start: {type(e).__name__}: {e}"[:2000],
                    }
                    print(f"[bench {done}/{total}] {p.label}: FAILED (server)")
                servers[placement] = None
                continue
            servers[placement] = server.startup_s
            try:
                warm_up(server.address, self.bench.warmup_requests)
                if self.bench.warmup_run and placement == self.plans[0].placement:
                    print("[bench] warm-up run (1 task, 1 step, discarded)", flush=True)
                    warm = dataclasses.replace(plans[0].tasks[0], total_steps=1)
                    w = self.execute(
                        RunPlan("warmup", plans[0].mode, placement, [warm], "warmup"),
                        server,
                        None,
                    )
                    if w["status"] != "ok":
                        logger.warning(f"warm-up run failed: {w.get('log_tail', '')}")
                for p in plans:
                    done += 1
                    if not server.alive():  # a crashed server fails one run only
                        logger.error(f"{placement} server died; restarting it")
                        server.stop()
                        server = self.start_server(placement)
                    print(
                        f"[bench {done}/{total}] {p.label}: mode={p.mode} "
                        f"placement={placement} tenants={p.tenants} ...",
                        flush=True,
                    )
                    r = self.execute(p, server, self.out)
                    results[p.label] = r
                    print(f"[bench {done}/{total}] {format_result(r)}", flush=True)
            finally:
                server.stop()
        metrics = {k: r["metrics"] for k, r in results.items() if "metrics" in r}
        rat = ratios(metrics)
        for k, r in results.items():
            r["ratios"] = rat.get(k, {})
        bench_result = {
            "bench": dataclasses.asdict(self.bench),
            "model": Path(self.cfg.vllm.model).name,
            "experiment_name": self.cfg.experiment_name,
            "server_start_s": servers,
            "kv_capacity_bytes": int(self.cfg.server.cpu_kvcache_space_gib * 2**30),
            "max_num_seqs": self.cfg.vllm.max_num_seqs,
            "total_s": time.monotonic() - t0,
            "runs": [results[p.label] for p in self.plans if p.label in results],
            "sweep": {
                str(k): v
                for k, v in sweep_labels(self.bench, self.cfg).items()
                if v in results
            },
        }
        write_outputs(bench_result, self.out)
        return bench_result


def task_kv_estimator(cfg: MARLaaSConfig):
    """``spec -> KV bytes of one rollout batch`` (0 when the model is unknown)."""
    from areal_marlaas.admission import task_kv_bytes
    from areal_marlaas.check import kv_model

    try:
        kv = kv_model(cfg)
    except Exception as e:  # the estimate only feeds the simulator
        logger.warning(f"no KV estimate: {e}")
        return lambda t: 0
    return lambda t: task_kv_bytes(
        kv, t.max_prompt_tokens, t.max_new_tokens, t.batch_size, t.n_samples
    )


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _tail(path: Path, n: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


# -- output ---------------------------------------------------------------------
def _f(v: Any, digits: int = 1, pct: bool = False) -> str:
    if v is None:
        return "-"
    if pct:
        return f"{100 * v:.0f}%"
    return f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def _pair(m: dict[str, Any], a: str, b: str) -> str:
    return f"{_f(m.get(a))}/{_f(m.get(b))}"


def format_result(r: dict[str, Any]) -> str:
    m = r.get("metrics") or {}
    if r["status"] != "ok":
        return f"{r['label']}: {r['status'].upper()} {r.get('error', '')}"
    return (
        f"{r['label']}: wall {_f(m.get('wall_s'))}s, "
        f"{_f(m.get('train_steps_per_hour'))} steps/h, "
        f"rollout util {_f(m.get('rollout_util_cpu'), pct=True)}, "
        f"train util {_f(m.get('train_util_cpu'), pct=True)}, "
        f"TTFS p50 {_f(m.get('ttfs_p50_s'))}s, TPTS p50 {_f(m.get('tpts_p50_s'))}s"
    )


MD_COLUMNS = [
    ("run", lambda r, m: r["label"]),
    ("mode", lambda r, m: r["mode"]),
    ("placement", lambda r, m: r["placement"]),
    ("tenants", lambda r, m: str(r["tenants"])),
    ("status", lambda r, m: r["status"]),
    ("wall s", lambda r, m: _f(m.get("wall_s"))),
    ("steps/h", lambda r, m: _f(m.get("train_steps_per_hour"))),
    (
        "speedup vs seq",
        lambda r, m: _f(r.get("ratios", {}).get("speedup_vs_sequential"), 2),
    ),
    ("rollout util (CPU)", lambda r, m: _f(m.get("rollout_util_cpu"), pct=True)),
    ("rollout busy (gauge)", lambda r, m: _f(m.get("rollout_busy_gauge"), pct=True)),
    ("train util (CPU)", lambda r, m: _f(m.get("train_util_cpu"), pct=True)),
    ("idle %", lambda r, m: _f(m.get("idle_pct"), 0)),
    ("TTFS p50/max s", lambda r, m: _pair(m, "ttfs_p50_s", "ttfs_max_s")),
    ("TPTS p50/p95 s", lambda r, m: _pair(m, "tpts_p50_s", "tpts_p95_s")),
]


def format_markdown(result: dict[str, Any]) -> str:
    b = result["bench"]
    lines = [
        "# marlaas bench",
        "",
        f"Model `{Path(result['model']).name}`; workload: "
        + (
            f"{b['replicas']} replicas of `{b['task']}`"
            if b["task"]
            else "the task mix"
        )
        + f", {b['steps'] or 'own'} steps each. Disaggregated: server on cores "
        f"{b['server_cpus']}, trainer on {b['trainer_cpus']}; collocated: both on "
        f"{b['collocated_cpus']}. Utilization = CPU time of the process tree / (window"
        " x its cores); gauge = share of samples with `num_requests_running > 0`.",
        "",
        "| " + " | ".join(c for c, _ in MD_COLUMNS) + " |",
        "|" + "---|" * len(MD_COLUMNS),
    ]
    for r in result["runs"]:
        m = r.get("metrics") or {}
        lines.append("| " + " | ".join(fn(r, m) for _, fn in MD_COLUMNS) + " |")
    failed = [r for r in result["runs"] if r["status"] != "ok"]
    if failed:
        lines += ["", "Failed runs:", ""]
        for r in failed:
            why = r.get("error") or (r.get("log_tail") or "").splitlines()[-1:] or [""]
            lines.append(f"* `{r['label']}`: {why if isinstance(why, str) else why[0]}")
    lines += format_phase_table(result["runs"])
    lines += [
        "",
        "![phase timeline](timeline.png)",
        "",
        "![utilization](utilization.png)",
        "",
    ]
    if result.get("sweep"):
        lines += ["![concurrency sweep](concurrency.png)", ""]
    return "\n".join(lines)


# Per-task phase columns: (header, phase, statistic). ``wait`` is time ready to
# roll out but held (sync barrier, admission, turn): summed, since it happens on
# some steps only; the others are per-step means.
PHASE_COLUMNS = (
    ("rollout mean s", "rollout", "mean"),
    ("wait total s", "wait", "total"),
    ("queue mean s", "queue", "mean"),
    ("train mean s", "train", "mean"),
    ("publish mean s", "publish", "mean"),
)


def format_phase_table(runs: list[dict[str, Any]]) -> list[str]:
    """Markdown lines: each run's per-task rollout latency and waiting time (the
    paper's Table 1 view), from the phases recorded in its ``events.jsonl``."""
    rows = [r for r in runs if r.get("phases")]
    if not rows:
        return []
    lines = [
        "",
        "Per task (wait = held by a sync barrier, admission or its turn; queue = "
        "waiting for the trainer):",
        "",
        "| run | task | steps | " + " | ".join(h for h, _, _ in PHASE_COLUMNS) + " |",
        "|" + "---|" * (3 + len(PHASE_COLUMNS)),
    ]
    for r in rows:
        for task in sorted(t for t in r["phases"] if t != "all"):
            ph = r["phases"][task]
            cells = [r["label"], task, str(ph.get("train", {}).get("n", 0))]
            for _, phase, stat in PHASE_COLUMNS:
                s = ph.get(phase)
                if s is None:
                    cells.append("0.0" if stat == "total" else "-")
                else:
                    v = s["mean_s"] * s["n"] if stat == "total" else s["mean_s"]
                    cells.append(f"{v:.1f}")
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def write_outputs(result: dict[str, Any], out: Path) -> None:
    from areal_marlaas.bench.plots import plot_all

    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(result, indent=1))
    (out / "bench.md").write_text(format_markdown(result))
    try:
        plot_all(result, out)
    except Exception as e:  # plots are a convenience; the numbers are written
        logger.error(f"plotting failed: {type(e).__name__}: {e}")
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    if size > OUT_LIMIT_BYTES:
        logger.warning(
            f"{out} holds {size / 2**20:.1f} MiB (> 3 MiB): do not commit it as is"
        )
    print(f"[bench] wrote {out} ({size / 1024:.0f} KiB)", flush=True)
