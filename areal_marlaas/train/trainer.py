"""``marlaas train``: many tenant tasks, one base model, one server, one trainer.

Wiring: the shared vLLM server (launched or attached) with the multi-LoRA rollout
engine; AReaL's FSDP actor with one LoRA slot and per-task state; the run
directory; and the scheduler runtime that loops every task through
rollout -> queue -> train -> commit -> publish.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from areal.api.alloc_mode import ModelAllocation
from areal.api.io_struct import FinetuneSpec
from areal.utils import logging
from areal.utils.hf_utils import load_hf_tokenizer
from areal.utils.network import find_free_ports
from areal.utils.stats_logger import StatsLogger

from areal_marlaas.admission import KVModel, task_kv_bytes
from areal_marlaas.config import MARLaaSConfig, TaskSpec
from areal_marlaas.fault import FaultToleranceConfig
from areal_marlaas.manager.data import TaskData
from areal_marlaas.manager.store import RunStore
from areal_marlaas.placement import parse_cpus, pin_current_process
from areal_marlaas.rollout.metrics import capacity_tokens, scrape
from areal_marlaas.rollout.session import RolloutSession, task_workflow
from areal_marlaas.scheduler.runtime import Runtime, TaskRun
from areal_marlaas.tasks import load_task_rows
from areal_marlaas.train.engine import MultiLoRAFSDPPPOActor
from areal_marlaas.workflows.reward import IsolatedReward

logger = logging.getLogger("MARLaaSTrainer")


def run_dir(cfg: MARLaaSConfig) -> Path:
    return Path(cfg.cluster.fileroot) / cfg.experiment_name / cfg.trial_name


def _port_free(host: str, port: str) -> bool:
    import socket

    with socket.socket() as sock:
        try:
            sock.bind((host, int(port)))
        except (OSError, ValueError):
            return False
    return True


def single_rank_env() -> None:
    """The in-process FSDP engine is one rank of a one-rank gloo/nccl group."""
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    # As rank 0 of a one-rank group we host the store: a port inherited from an
    # earlier engine (this process's or a parent's) may still be held, so only a
    # free one is kept.
    port = os.environ.get("MASTER_PORT", "")
    if not port or not _port_free(os.environ["MASTER_ADDR"], port):
        os.environ["MASTER_PORT"] = str(find_free_ports(1)[0])


def add_tenant(
    engine,
    spec: TaskSpec,
    store: RunStore,
    tokenizer,
    tokenizer_path: str,
    kv: KVModel | None = None,
    resume: bool = False,
    fault: FaultToleranceConfig | None = None,
):
    """Give ``spec`` its state on the trainer, commit its v0 adapter, and return
    what the runtime needs to run it (``engine``: the FSDP actor or its handle).

    With ``resume``, a task the run directory already committed continues from
    its last committed version: adapter, optimizer/LR/RNG state (its
    ``optimizer.pt``) and data cursor. The dataset is read first, so a task whose
    data is broken fails before it takes anything on the trainer."""
    rows = load_task_rows(spec)
    state = store.committed(spec.name) if resume else None
    version = state["version"] if state else 0
    engine.add_task(
        spec.name,
        lr=spec.lr,
        total_steps=spec.total_steps,
        n_samples=spec.n_samples,
        seed=spec.seed,
        temperature=spec.temperature,
        **(
            {
                "init_adapter": str(store.adapter_dir(spec.name, version)),
                "version": version,
            }
            if state
            else {}
        ),
    )
    if state:
        logger.info(
            f"task {spec.name}: resuming at v{version} (cursor {state['cursor']})"
        )
    else:
        engine.save_adapter(spec.name, str(store.adapter_dir(spec.name, 0)))
        store.commit(spec.name, 0, {"cursor": 0, "steps": 0})
    workflow, kwargs = task_workflow(spec, tokenizer_path, fault)
    data = TaskData(
        rows,
        spec.seed,
        tokenizer,
        spec.max_prompt_tokens,
        cursor=state["cursor"] if state else 0,
    )
    kv_bytes = 0
    if kv is not None:
        kv_bytes = task_kv_bytes(
            kv,
            spec.max_prompt_tokens,
            spec.max_new_tokens,
            spec.batch_size,
            spec.n_samples,
        )
    return TaskRun(
        name=spec.name,
        total_steps=spec.total_steps,
        batch_size=spec.batch_size,
        n_samples=spec.n_samples,
        data=data,
        workflow=workflow,
        workflow_kwargs=kwargs,
        kv_bytes=kv_bytes,
        priority=spec.priority,
        start_version=version,
    )


def server_kv_capacity(cfg: MARLaaSConfig, kv: KVModel, address: str) -> int | None:
    """KV-cache bytes the server holds: from its own report (cache_config_info),
    else what the config gives a launched CPU server; None when unknown."""
    from areal_marlaas.check import kv_capacity_bytes

    try:
        tokens = capacity_tokens(scrape(address))
    except Exception as e:  # an attached server without /metrics
        logger.warning(f"cannot read the KV capacity of {address}: {e}")
        tokens = None
    if tokens:
        return tokens * kv.bytes_per_token
    return kv_capacity_bytes(cfg)


def kv_budget(cfg: MARLaaSConfig, capacity: int | None) -> int | None:
    sched = cfg.scheduler
    if sched.kv_budget_bytes:
        return sched.kv_budget_bytes
    if capacity is None:
        return None
    return int(capacity * sched.kv_budget_fraction)


def kv_probe(address: str, capacity: int):
    """Bytes of KV the server reports in use (None when it cannot be read)."""

    def probe() -> int | None:
        try:
            return int(scrape(address, timeout=2).kv_cache_usage * capacity)
        except Exception:
            return None

    return probe


class MultiTaskTrainer:
    def __init__(self, cfg: MARLaaSConfig, task_errors: dict[str, str] | None = None):
        """``task_errors``: tasks that already failed their checks (they are
        reported failed; the others run)."""
        self.cfg = cfg
        self.store = RunStore(run_dir(cfg), fresh=not cfg.resume)
        self.failed_at_start: dict[str, str] = dict(task_errors or {})
        self.restarts: list[dict[str, Any]] = []
        self.engine = None  # the FSDP actor, or its single-controller handle
        self.scheduler = None
        self.session: RolloutSession | None = None
        self.timings: dict[str, float] = {}

    def _init_scheduler(self):
        """AReaL's single-controller scheduler, or None for in-process engines."""
        cfg = self.cfg
        kind = cfg.scheduler.type
        if kind is None:
            return None
        if cfg.cluster.name_resolve.type == "nfs":
            Path(cfg.cluster.name_resolve.nfs_record_root).mkdir(
                parents=True, exist_ok=True
            )
        if kind == "local":
            from areal.infra.scheduler.local import LocalScheduler

            return LocalScheduler(exp_config=cfg)
        if kind == "ray":
            from areal.infra.scheduler.ray import RayScheduler

            return RayScheduler(exp_config=cfg)
        if kind == "slurm":
            from areal.infra.scheduler.slurm import SlurmScheduler

            return SlurmScheduler(exp_config=cfg)
        raise ValueError(f"scheduler.type must be local|ray|slurm|null, got {kind!r}")

    def _build_trainer(self):
        cfg = self.cfg
        t0 = time.monotonic()
        ft_spec = FinetuneSpec(1, sum(t.total_steps for t in cfg.tasks), 1)
        if self.scheduler is None:
            single_rank_env()
            engine = MultiLoRAFSDPPPOActor(cfg.actor)
            engine.create_process_group()
            engine.initialize(None, ft_spec)
        else:
            alloc = ModelAllocation.from_str(cfg.actor.backend, name="actor")
            engine = MultiLoRAFSDPPPOActor.as_controller(cfg.actor, self.scheduler)
            engine.create_process_group(parallel_strategy=alloc.parallel)
            engine.initialize(addr=None, ft_spec=ft_spec, role="actor")
        self.timings["trainer_init_s"] = time.monotonic() - t0
        return engine

    def _prepare_tasks(self, engine) -> list[TaskRun]:
        from areal_marlaas.check import kv_model

        tokenizer = load_hf_tokenizer(self.cfg.tokenizer_path)
        self.kv = kv_model(self.cfg)
        tasks = []
        for spec in self.cfg.tasks:
            if spec.name in self.failed_at_start:
                self._fail_at_start(spec.name, self.failed_at_start[spec.name])
                continue
            try:
                tasks.append(
                    add_tenant(
                        engine,
                        spec,
                        self.store,
                        tokenizer,
                        self.cfg.tokenizer_path,
                        self.kv,
                        resume=self.cfg.resume,
                        fault=self.cfg.fault,
                    )
                )
            except Exception as e:  # one tenant's broken data never stops the run
                self._fail_at_start(spec.name, f"{type(e).__name__}: {e}")
        return tasks

    def _fail_at_start(self, task: str, reason: str) -> None:
        logger.error(f"task {task} failed at start: {reason}")
        self.failed_at_start[task] = reason
        self.store.record(
            {"task": task, "status": "failed", "reason": reason, "t": time.time()}
        )

    def _on_restart(self, r) -> None:
        """A rollout-server fault, in events.jsonl and the summary."""
        record = {
            "fault": "server_restart",
            "reason": r.reason,
            "ok": r.ok,
            "error": r.error,
            "detect_s": r.detect_s,
            "restart_s": r.restart_s,
            "reload_s": r.reload_s,
            "adapters": r.adapters,
            "t": r.detected_at,
        }
        self.restarts.append(record)
        self.store.record(record)

    def _pin_trainer(self) -> None:
        """Disaggregated placement on CPU: the in-process trainer on its cores."""
        import torch

        cpus = parse_cpus(self.cfg.scheduler.trainer_cpus, "scheduler.trainer_cpus")
        if not cpus:
            return
        if self.scheduler is not None:
            logger.warning(
                "scheduler.trainer_cpus pins only in-process engines "
                "(scheduler.type=null); use the scheduler's placement for workers"
            )
            return
        used = pin_current_process(cpus)
        torch.set_num_threads(len(used))
        logger.info(f"trainer pinned to cores {sorted(used)}")

    def _admission(self) -> dict[str, Any]:
        """Runtime arguments for the mode and KV-aware admission."""
        sched = self.cfg.scheduler
        address = self.session.addresses[0] if self.session.addresses else None
        capacity = server_kv_capacity(self.cfg, self.kv, address) if address else None
        budget = kv_budget(self.cfg, capacity)
        probe = None
        if sched.kv_live and address and capacity:
            probe = kv_probe(address, capacity)
        self.timings["kv_capacity_bytes"] = capacity or 0
        logger.info(
            f"mode={sched.mode} kv capacity={capacity} budget={budget} "
            f"max_rolling={sched.max_rolling} live={probe is not None}"
        )
        return dict(
            mode=sched.mode,
            kv_budget=budget,
            max_rolling=sched.max_rolling,
            task_retries=sched.task_retries,
            kv_probe=probe,
            kv_poll_interval_s=sched.kv_poll_interval_s,
        )

    def run(self) -> dict[str, Any]:
        cfg = self.cfg
        t0 = time.monotonic()
        try:
            self.scheduler = self._init_scheduler()
            self._pin_trainer()
            self.engine = engine = self._build_trainer()
            tasks = self._prepare_tasks(engine)
            self.session = RolloutSession(cfg, self.store.root)
            rollout = self.session.start(self.scheduler)
            rollout = self.session.supervise(rollout, on_restart=self._on_restart)
            self.timings["server_start_s"] = self.session.server_start_s or 0.0
            for t in tasks:
                rollout.register_task(
                    t.name,
                    t.start_version,
                    self.store.adapter_dir(t.name, t.start_version),
                )
            self.timings["setup_s"] = time.monotonic() - t0
            runtime = Runtime(
                tasks,
                rollout,
                engine,
                self.store,
                rollout_timeout=cfg.rollout.request_timeout,
                on_step=self._progress,
                keep_adapters=cfg.fault.keep_adapters,
                save_retries=cfg.fault.save_retries,
                **self._admission(),
            )
            self._t_run = time.time()
            self._n_commits = 0
            self.stats_logger = StatsLogger(
                cfg, FinetuneSpec(1, sum(t.total_steps for t in tasks), 1)
            )
            summary = runtime.run()
            self.stats_logger.close()
        finally:
            self.close()
        for name, reason in self.failed_at_start.items():
            summary["tasks"][name] = {
                "steps": 0,
                "final_version": None,
                "status": "failed",
                "error": reason,
            }
        summary["server_restarts"] = self.restarts
        summary["resumed"] = self.cfg.resume
        summary["run_dir"] = str(self.store.root)
        summary["timings"] = self.timings
        self.store.write_summary(summary)
        return summary

    def _progress(self, r: dict[str, Any], stats: dict[str, float]) -> None:
        """Per-step: a terminal line, and the step's metrics to AReaL's stats
        logger (tensorboard/wandb/... as configured)."""
        self._n_commits += 1
        scalars = {
            f"marlaas/{r['task']}/{k}": float(r[k])
            for k in ("reward_mean", "queue_wait_s", "train_s", "version")
        }
        self.stats_logger.commit(
            0, self._n_commits - 1, self._n_commits - 1, {**stats, **scalars}
        )
        logger.info(
            f"[{time.time() - self._t_run:7.1f}s] {r['task']:<12} v{r['version']:<3} "
            f"reward={r['reward_mean']:.3f} queue={r['queue_wait_s']:.1f}s "
            f"train={r['train_s']:.1f}s"
        )

    def close(self) -> None:
        IsolatedReward.shutdown_all()
        if self.session is not None:
            self.session.stop()
            self.session = None
        if self.engine is not None:
            self.engine.destroy()
            self.engine = None
        if self.scheduler is not None:
            self.scheduler.delete_workers(None)
            self.scheduler = None


def format_summary(summary: dict[str, Any]) -> str:
    cols = ["task", "status", "steps", "version", "reward_first", "reward_last"]
    cols += ["ttfs_s", "tpts_p50_s"]
    lines = ["  ".join(f"{c:>12}" for c in cols)]
    for name, t in summary["tasks"].items():
        vals = [name, t["status"], t["steps"], t["final_version"]]
        vals += [t.get(k) for k in ("reward_first", "reward_last")]
        vals += [t.get(k) for k in ("ttfs_s", "tpts_p50_s")]
        lines.append("  ".join(f"{_fmt(v):>12}" for v in vals))
    for name, t in summary["tasks"].items():
        if t["status"] != "done" and t.get("error"):
            lines.append(f"{name} {t['status']}: {t['error']}")
    lines.append(
        f"mode={summary['mode']} wall={summary['wall_s']:.1f}s "
        f"train_steps/h={summary['train_steps_per_hour']:.1f} "
        f"admission_holds={summary.get('admission_holds', 0)}"
    )
    lines.append(f"run dir: {summary['run_dir']}")
    return "\n".join(lines)


def _fmt(v) -> str:
    if v is None:
        return "-"
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def main(argv: list[str] | None = None) -> int:
    import sys

    from areal_marlaas.check import check_config
    from areal_marlaas.config import load_config

    cfg, _ = load_config(list(sys.argv[1:] if argv is None else argv))
    task_errors: dict[str, str] = {}  # a task that fails its checks fails alone
    check_config(cfg, task_errors)
    summary = MultiTaskTrainer(cfg, task_errors).run()
    print(format_summary(summary), flush=True)
    failed = [n for n, t in summary["tasks"].items() if t["status"] != "done"]
    return 1 if failed else 0
