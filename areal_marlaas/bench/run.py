"""Running ``marlaas bench``: one vLLM server per placement, warmed up, and each
planned configuration as its own ``marlaas train`` subprocess attached to it
(``scheduler.type=null``: in-process engines, one process per run so memory is
freed between runs), sampling utilization while it goes. A failed run is
reported, not fatal."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from areal.utils import logging
from omegaconf import DictConfig, OmegaConf, open_dict

from areal_marlaas.admission import KVModel
from areal_marlaas.bench.machine import describe, machine
from areal_marlaas.bench.plan import (
    PLACEMENTS,
    REPLICATED,
    RunPlan,
    placement_cpus,
    plan_runs,
    sweep_labels,
)
from areal_marlaas.bench.report import compact_run, format_result, write_outputs
from areal_marlaas.bench.run_metrics import ratios, run_metrics
from areal_marlaas.bench.sampler import UtilizationSampler
from areal_marlaas.config import (
    BenchConfig,
    BenchRunConfig,
    MARLaaSConfig,
    TaskSpec,
    load_config,
)
from areal_marlaas.config.loader import compose_yaml, parse_args, resolve_tasks_path
from areal_marlaas.placement import parse_cpus, pin_current_process
from areal_marlaas.procs import stop_group, tail
from areal_marlaas.rundir.phases import phase_stats
from areal_marlaas.rundir.reader import load_run

logger = logging.getLogger("MARLaaSBench")


_MACHINE_KEYS = ("cluster.fileroot=", "server.addresses=")


def portable_overrides(cmd: list[str]) -> list[str]:
    """The ``key=value`` overrides of a run command that say how it ran, not where."""
    return [a for a in cmd if "=" in a and not a.startswith(_MACHINE_KEYS)]


def load_bench_config(
    argv: list[str],
) -> tuple[BenchConfig, BenchRunConfig, str, list[str]]:
    """``--config X.yaml [--tasks T.yaml] [bench.k=v ...] [k=v ...]`` -> the bench
    settings, the validated config, the training YAML every run starts from (the
    main YAML without its ``bench`` section, its tasks file made absolute) and the
    training overrides (every override but ``bench.*``)."""
    cfg, config_file = load_config(argv, schema=BenchRunConfig)
    args = parse_args(argv)
    train_overrides = [
        o for o in args.overrides if not o.lstrip("+").startswith("bench.")
    ]
    raw = compose_yaml(config_file)
    with open_dict(raw):
        raw.pop("bench", None)
        if raw.get("tasks_file"):
            raw.tasks_file = str(resolve_tasks_path(str(raw.tasks_file), config_file))
    base = Path(tempfile.mkdtemp(prefix="marlaas-bench-")) / "train.yaml"
    OmegaConf.save(raw, base)
    tasks = []
    if args.tasks:
        tasks = ["--tasks", str(resolve_tasks_path(args.tasks, config_file))]
    return cfg.bench, cfg, str(base), [*tasks, *train_overrides]


def warm_up(address: str, n: int, max_tokens: int = 16) -> None:
    """A few concurrent base-model completions, so the first run does not pay for
    the server's first batches."""
    if n <= 0:
        return
    models = httpx.get(f"http://{address}/v1/models", timeout=30).json()
    model = models["data"][0]["id"]

    def one(i: int) -> None:
        httpx.post(
            f"http://{address}/v1/completions",
            json={"model": model, "prompt": f"{i} + {i} =", "max_tokens": max_tokens},
            timeout=300,
        )

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()


def train_cmd(base_yaml: str, tasks_yaml: Path, overrides: list[str]) -> list[str]:
    """A ``marlaas train`` process of this interpreter on ``tasks_yaml``."""
    return [
        sys.executable,
        "-m",
        "areal_marlaas.train",
        "--config",
        base_yaml,
        "--tasks",
        str(tasks_yaml),
        *overrides,
    ]


def write_tasks_yaml(tasks: list[TaskSpec], path: Path) -> None:
    OmegaConf.save(
        OmegaConf.create({"tasks": [dataclasses.asdict(t) for t in tasks]}), path
    )


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
        self.kv_bytes = _kv_estimator(cfg)
        self.machine = machine()

    def train_command(
        self, plan: RunPlan, address: str, tasks_yaml: Path, label: str
    ) -> list:
        cpus = placement_cpus(self.bench, plan.placement)
        overrides = {
            "experiment_name": self.cfg.experiment_name,
            "trial_name": label,
            "cluster.fileroot": str(self.work),
            "server.addresses": f"['{address}']",
            "scheduler.type": plan.scheduler,
            "scheduler.mode": plan.mode,
            **{k: v.format(**cpus) for k, v in plan.overrides.items()},
        }
        if plan.scheduler == "null":  # in-process: pin and size torch's threads
            overrides["scheduler.trainer_cpus"] = cpus["trainer_cpus"]
        return train_cmd(
            self.base_yaml,
            tasks_yaml,
            [*self.train_overrides, *(f"{k}={v}" for k, v in overrides.items())],
        )

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

    def execute(
        self, plan: RunPlan, server, out_dir: Path | None, repeat: int = 0
    ) -> dict[str, Any]:
        """One ``marlaas train`` subprocess, sampled; its metrics (or error). The
        subprocess (and any LocalScheduler workers it starts, which inherit its
        affinity and size their threads to it) runs on the trainer's cores."""
        label = plan.label if self.bench.repeats == 1 else f"{plan.label}.r{repeat}"
        tasks_yaml = self.work / f"{label}.tasks.yaml"
        write_tasks_yaml(plan.tasks, tasks_yaml)
        cmd = self.train_command(plan, server.address, tasks_yaml, label)
        log_path = self.work / f"{label}.log"
        run_dir = self.work / self.cfg.experiment_name / label
        shutil.rmtree(run_dir, ignore_errors=True)
        cpus = parse_cpus(
            placement_cpus(self.bench, plan.placement)["trainer_cpus"],
            "bench.trainer_cpus",
        )
        result: dict[str, Any] = {
            "label": label,
            "config": plan.label,
            "repeat": repeat,
            "scheduler": plan.scheduler,
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
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=(lambda: pin_current_process(cpus)) if cpus else None,
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
            stop_group(proc, graceful=False)
            rc = None
        except BaseException:  # Ctrl-C: its own session would outlive the bench
            stop_group(proc, graceful=False)
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
            result["log_tail"] = tail(log_path, 25)
        if run["steps"]:
            by_task: dict[str, list[float]] = {}
            for step in sorted(run["steps"], key=lambda x: x["t_commit"]):
                by_task.setdefault(step["task"], []).append(round(step["train_s"], 3))
            result["train_s_by_task"] = by_task
        if run["events"]:
            result["metrics"] = run_metrics(run, samples, cores)
            result["phases"] = phase_stats(run_dir)
            if out_dir is not None:
                compact_run(run, samples, out_dir / "runs" / label, 400)
        if not self.bench.keep_adapters:
            shutil.rmtree(run_dir / "tasks", ignore_errors=True)
        return result

    def _replicated(
        self, results: dict[str, dict[str, Any]], done: int, total: int
    ) -> int:
        """The replicated AReaL runs, after the MARLaaS runs (whose server is
        stopped by then); each repeat in ascending tenant count, so a count's
        memory is projected from the one below it before it is started."""
        import psutil

        from areal_marlaas.bench.replicated import execute_replicated

        plans = [p for p in self.plans if p.placement == REPLICATED]
        limit = self.bench.memory_limit_gib or psutil.virtual_memory().total / 2**30
        for repeat in range(self.bench.repeats):
            previous = None
            for p in plans:
                done += 1
                print(
                    f"[bench {done}/{total}] {p.label} (repeat {repeat}): "
                    f"{p.tenants} AReaL PPOTrainer jobs, each with its own server ...",
                    flush=True,
                )
                r = execute_replicated(
                    self.bench, self.cfg, p, self.work, repeat, previous, limit
                )
                results[r["label"]] = r
                if r["status"] == "ok":
                    previous = r
                print(f"[bench {done}/{total}] {format_result(r)}", flush=True)
        return done

    def run(self) -> dict[str, Any]:
        self.work.mkdir(parents=True, exist_ok=True)
        self.out.mkdir(parents=True, exist_ok=True)
        # Each run gets its tasks as its own --tasks file.
        base = OmegaConf.load(self.base_yaml)
        assert isinstance(base, DictConfig)  # a config YAML is a mapping
        with open_dict(base):
            base.pop("tasks", None)
            base.pop("tasks_file", None)
        OmegaConf.save(base, self.work / "train.yaml")
        self.base_yaml = str(self.work / "train.yaml")
        t0 = time.monotonic()
        results: dict[str, dict[str, Any]] = {}
        total = len(self.plans) * self.bench.repeats
        done = 0
        print(f"[bench] machine: {describe(self.machine)}", flush=True)
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
                # Interleaved: every configuration once, then again, so drift
                # (thermal, other load) hits every mode alike.
                for repeat in range(self.bench.repeats):
                    for p in plans:
                        done += 1
                        if not server.alive():  # a crash fails one run only
                            logger.error(f"{placement} server died; restarting it")
                            server.stop()
                            server = self.start_server(placement)
                        print(
                            f"[bench {done}/{total}] {p.label} (repeat {repeat}): "
                            f"mode={p.mode} scheduler={p.scheduler} "
                            f"placement={placement} tenants={p.tenants} ...",
                            flush=True,
                        )
                        r = self.execute(p, server, self.out, repeat)
                        end_to_end(r, server.startup_s)
                        results[r["label"]] = r
                        print(f"[bench {done}/{total}] {format_result(r)}", flush=True)
            finally:
                server.stop()
        done = self._replicated(results, done, total)
        # Ratios within each repeat (against that repeat's sequential run).
        for repeat in range(self.bench.repeats):
            mine = {
                r["config"]: r
                for r in results.values()
                if r.get("repeat") == repeat and "metrics" in r
            }
            rat = ratios({c: r["metrics"] for c, r in mine.items()})
            for c, r in mine.items():
                r["ratios"] = rat.get(c, {})
        bench_result = {
            "machine": self.machine,
            "bench": dataclasses.asdict(self.bench),
            "model": Path(self.cfg.vllm.model).name,
            "experiment_name": self.cfg.experiment_name,
            "server_start_s": servers,
            "kv_capacity_bytes": int(self.cfg.server.cpu_kvcache_space_gib * 2**30),
            "max_num_seqs": self.cfg.vllm.max_num_seqs,
            "total_s": time.monotonic() - t0,
            "runs": list(results.values()),
            "sweep": {
                str(k): v
                for k, v in sweep_labels(self.bench, self.cfg).items()
                if any(r.get("config") == v for r in results.values())
            },
        }
        write_outputs(bench_result, self.out)
        return bench_result


def end_to_end(r: dict[str, Any], server_start_s: float | None) -> None:
    """What a user starting this run fresh waits: its server's start-up (the
    bench keeps one warm across runs) plus the run's process, and steps/h on it."""
    m = r.get("metrics")
    if m is None or r.get("process_s") is None or server_start_s is None:
        return
    m["e2e_s"] = r["process_s"] + server_start_s
    m["e2e_steps_per_hour"] = m["steps"] / m["e2e_s"] * 3600


def _kv_estimator(cfg: MARLaaSConfig):
    """``spec -> KV bytes of one rollout batch`` (0 when the model is unknown)."""
    try:
        kv = KVModel.for_config(cfg)
    except Exception as e:  # the estimate only feeds the simulator
        logger.warning(f"no KV estimate: {e}")
        return lambda t: 0
    return kv.task_bytes
