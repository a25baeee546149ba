"""What ``marlaas train`` and ``marlaas service`` both run on: AReaL's scheduler,
the trainer pool, the rollout session (the shared vLLM server, supervised), the
run directory, the KV model and the screen.

Built in two steps, ``start_trainer`` then ``start_rollout``, because
``marlaas train`` gives the trainer its tasks between them (a task whose data is
broken fails before the server starts); the service adds tasks later, as jobs
arrive. ``close`` takes down whatever was started, in reverse order.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from areal.api.alloc_mode import ModelAllocation
from areal.api.io_struct import FinetuneSpec
from areal.utils import logging
from areal.utils.network import find_free_ports

from areal_marlaas import admission
from areal_marlaas.admission import KVModel
from areal_marlaas.cluster import close_scheduler, make_scheduler
from areal_marlaas.config import ConfigError, MARLaaSConfig, TaskSpec
from areal_marlaas.methods import Method
from areal_marlaas.methods.examples import load_examples
from areal_marlaas.placement import parse_cpus, pin_current_process
from areal_marlaas.procs import close_each
from areal_marlaas.rollout.controller import MultiTaskRolloutController
from areal_marlaas.rollout.session import RolloutSession
from areal_marlaas.rundir.records import EvalRecord, EvalSample, StepRecord
from areal_marlaas.rundir.writer import RunStore
from areal_marlaas.scheduler.backends import RolloutBackend, TrainBackend
from areal_marlaas.scheduler.core import Concurrency, Mode, RolloutOrder, TrainOrder
from areal_marlaas.scheduler.runtime import Runtime, RuntimeOptions, TaskRun
from areal_marlaas.tasks import load_eval_rows, load_task_rows
from areal_marlaas.tasks.prompt_order import TaskData
from areal_marlaas.tools.local_search import stop_local_search_servers
from areal_marlaas.train import screen
from areal_marlaas.train.elastic import ElasticCores, ElasticTrainBackend
from areal_marlaas.train.engine import MultiLoRAFSDPPPOActor
from areal_marlaas.train.pool import TrainerPool, trainer_role
from areal_marlaas.workflows import task_workflow
from areal_marlaas.workflows.reward import IsolatedReward

logger = logging.getLogger("MARLaaSStack")


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
    cfg: MARLaaSConfig,
    kv: KVModel | None = None,
    resume: bool = False,
    grading: dict | None = None,
) -> TaskRun:
    """Give ``spec`` its state on the trainer, commit its v0 adapter, and return
    what the runtime needs to run it (``engine``: the FSDP actor or its handle).

    With ``resume``, a task the run directory already committed continues from
    its last committed version: adapter, optimizer/LR/RNG state (its
    ``optimizer.pt``) and data cursor. The dataset is read first, so a task whose
    data is broken fails before it takes anything on the trainer."""
    if not Method(spec.method).rolls_out:
        return _add_examples_task(engine, spec, store, tokenizer, resume)
    rows = load_task_rows(spec)
    eval_rows = load_eval_rows(spec, tokenizer) if spec.eval_interval else None
    state = _start_state(
        engine,
        spec,
        store,
        resume,
        n_samples=spec.n_samples,
        temperature=spec.temperature,
        ppo=spec.ppo.overrides(),
        audit_trajectories=cfg.audit.trajectories,
        audit_max_mean_gap=cfg.audit.limit(cfg.vllm.dtype, cfg.actor.dtype),
    )
    version = state["version"] if state else 0
    workflow, kwargs = task_workflow(spec, cfg.tokenizer_path, cfg.fault, grading)
    data = TaskData(
        rows,
        spec.seed,
        tokenizer,
        spec.max_prompt_tokens,
        cursor=state["cursor"] if state else 0,
    )
    return TaskRun(
        name=spec.name,
        total_steps=spec.total_steps,
        batch_size=spec.batch_size,
        n_samples=spec.n_samples,
        data=data,
        workflow=workflow,
        workflow_kwargs=kwargs,
        kv_bytes=kv.task_bytes(spec) if kv is not None else 0,
        priority=spec.priority,
        tenant=spec.tenant,
        weight=spec.weight,
        start_version=version,
        eval_rows=eval_rows,
        eval_every=spec.eval_interval,
        eval_kv_bytes=kv.eval_bytes(spec) if kv is not None and eval_rows else 0,
    )


def _start_state(
    engine, spec: TaskSpec, store: RunStore, resume: bool, **kwargs: Any
) -> dict | None:
    """Give the task its state on the trainer: fresh or from ``init_adapter``
    (v0 committed now) or, on resume, its last committed version's; returns
    that commit's state."""
    state = store.committed(spec.name) if resume else None
    version = state["version"] if state else 0
    start: dict[str, Any] = {}
    if state:
        start = {
            "init_adapter": str(store.adapter_dir(spec.name, version)),
            "version": version,
        }
    elif spec.init_adapter:  # continued fine-tuning: its weights, a new optimizer
        start = {"init_adapter": spec.init_adapter, "restore_state": False}
    engine.add_task(
        spec.name,
        lr=spec.lr,
        total_steps=spec.total_steps,
        seed=spec.seed,
        **kwargs,
        **start,
    )
    if state:
        logger.info(
            f"task {spec.name}: resuming at v{version} (cursor {state['cursor']})"
        )
    else:
        engine.save_adapter(spec.name, str(store.adapter_dir(spec.name, 0)))
        store.commit(spec.name, 0, {"cursor": 0, "steps": 0})
    return state


def _add_examples_task(
    engine, spec: TaskSpec, store: RunStore, tokenizer, resume: bool
) -> TaskRun:
    """A task that trains on its own examples (SFT demonstrations, DPO pairs):
    its rows (and validation rows) tokenized, its state on the trainer; no
    workflow, no KV. A DPO task's reference is the adapter it started from
    (``spec.init_adapter``), else the base model."""
    method, limit = Method(spec.method), spec.max_example_tokens
    try:
        examples = load_examples(
            method,
            tokenizer,
            spec.dataset.path,
            spec.dataset.split,
            spec.dataset.size,
            limit,
        )
        valid = None
        if spec.eval_dataset is not None:
            ds = spec.eval_dataset
            valid = load_examples(method, tokenizer, ds.path, ds.split, ds.size, limit)
    except FileNotFoundError as e:
        raise ConfigError(f"task {spec.name!r}: {e}") from e
    except (OSError, ValueError) as e:
        raise ConfigError(f"task {spec.name!r}: cannot use its dataset: {e}") from e
    extra: dict[str, Any] = {}
    if method is Method.DPO:
        extra["beta"] = spec.beta
        if spec.init_adapter:
            extra["reference_adapter"] = spec.init_adapter
    state = _start_state(
        engine,
        spec,
        store,
        resume,
        n_samples=1,
        temperature=1.0,
        train_method=method,
        **extra,
    )
    state = state or {}
    return TaskRun(
        name=spec.name,
        total_steps=spec.total_steps,
        batch_size=spec.batch_size,
        n_samples=1,
        data=TaskData(examples, spec.seed, cursor=state.get("cursor", 0)),
        workflow="",
        workflow_kwargs={},
        priority=spec.priority,
        tenant=spec.tenant,
        weight=spec.weight,
        start_version=state.get("version", 0),
        method=method,
        valid=None
        if valid is None
        else TaskData(valid, spec.seed, cursor=state.get("valid_cursor", 0)),
        valid_full=valid,
    )


class ServedRollout(RolloutBackend, Protocol):
    """The rollout side as the stack's owners use it: the runtime's backend,
    plus giving a task its starting adapter on the server."""

    def register_task(self, task: str, version: int, path: str | Path) -> None: ...


class TrainingStack:
    """The scheduler, trainer pool and rollout session of one run directory."""

    def __init__(self, cfg: MARLaaSConfig, title: str):
        self.cfg = cfg
        self.store = RunStore(cfg.run_dir, fresh=not cfg.resume)
        self.kv = KVModel.for_config(cfg)
        self.screen = screen.Screen(cfg, self.store.root, title=title)
        self.timings: dict[str, float] = {}
        self.restarts: list[dict[str, Any]] = []  # rollout-server faults
        self.scheduler = None  # AReaL's single controller; None: in-process
        self.engine: TrainerPool | None = None
        self.session: RolloutSession | None = None
        self.rollout: ServedRollout | None = None  # the supervised engine
        self.elastic: ElasticCores | None = None  # scheduler.elastic_cpus
        self.runtime: Runtime | None = None  # set by the caller (elastic reads it)
        self.stats_logger = None

    # -- start-up -----------------------------------------------------------------
    def start_trainer(self) -> TrainerPool:
        """AReaL's scheduler (if any), the trainer's cores, then the trainer pool:
        one in-process FSDP actor, or ``scheduler.trainers`` workers."""
        self.scheduler = make_scheduler(self.cfg, self.store.root)
        self._pin_trainer()
        self.screen.phase("starting the trainer")
        cfg = self.cfg
        t0 = time.monotonic()
        ft_spec = FinetuneSpec(1, sum(t.total_steps for t in cfg.tasks), 1)
        engines = []
        if self.scheduler is None:
            single_rank_env()
            engine = MultiLoRAFSDPPPOActor(cfg.actor)
            engine.create_process_group()
            engine.initialize(None, ft_spec)
            engines = [engine]
        else:
            try:
                for i in range(cfg.scheduler.trainers):
                    engines.append(self._trainer_worker(trainer_role(i), ft_spec))
            except BaseException:
                for e in engines:
                    e.destroy()
                raise
        self.timings["trainer_init_s"] = time.monotonic() - t0
        self.engine = TrainerPool(engines)
        return self.engine

    def _trainer_worker(self, role: str, ft_spec: FinetuneSpec):
        """One trainer worker (AReaL's controller and its ranks) as ``role``."""
        cfg = self.cfg
        alloc = ModelAllocation.from_str(cfg.actor.backend, name="actor")
        engine = MultiLoRAFSDPPPOActor.as_controller(cfg.actor, self.scheduler)
        # The driver's own one-rank gloo group prints a line past logging.
        with screen.native_stdout_muted(not cfg.verbose):
            engine.create_process_group(parallel_strategy=alloc.parallel)
        engine.initialize(addr=None, ft_spec=ft_spec, role=role)
        return engine

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
        borrow = parse_cpus(self.cfg.scheduler.elastic_cpus, "scheduler.elastic_cpus")
        borrow &= set(range(os.cpu_count() or 1)) - used  # cores that exist here
        # Without cores to borrow it never switches; steps still record cores.
        self.elastic = ElasticCores(used, borrow, self._rollout_busy)
        if borrow:
            logger.info(f"elastic: borrows cores {sorted(borrow)} while rollouts idle")

    def _rollout_busy(self) -> bool:
        return self.runtime is None or self.runtime.rollouts_running > 0

    def start_rollout(self) -> ServedRollout:
        """The shared vLLM server (launched or attached) and the multi-LoRA
        rollout engine, supervised: a dead server is restarted and its adapters
        reloaded."""
        self.screen.phase("starting the rollout server")
        self.session = RolloutSession(self.cfg, self.store.root)
        rollout = self.session.start(self.scheduler)
        if isinstance(rollout, MultiTaskRolloutController):
            rollout.on_transfer = self.store.record  # pushed adapters' cost
        self.rollout = self.session.supervise(rollout, on_restart=self._on_restart)
        self.timings["server_start_s"] = self.session.server_start_s or 0.0
        return self.rollout

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

    # -- what the runtime gets ------------------------------------------------------
    def train_backend(self) -> TrainBackend:
        """What the runtime trains with: the pool, sized per step when pinned."""
        assert self.engine is not None, "start_trainer first"
        if self.elastic is None:
            return self.engine
        self.elastic.install(self.engine.engines[0].model)  # in-process: one engine
        return ElasticTrainBackend(self.engine, self.elastic)

    def runtime_options(
        self, on_step: Callable[[StepRecord, dict[str, float]], None]
    ) -> RuntimeOptions:
        """The mode, KV-aware admission and retries, for the runtime."""
        cfg, sched = self.cfg, self.cfg.scheduler
        assert self.session is not None, "start_rollout first"
        address = self.session.addresses[0] if self.session.addresses else None
        capacity = admission.capacity(cfg, self.kv, address)
        budget = admission.budget(cfg, capacity)
        probe = None
        if sched.kv_live and address and capacity:
            probe = admission.usage_probe(address, capacity)
        self.timings["kv_capacity_bytes"] = capacity or 0
        logger.info(
            f"mode={sched.mode} kv capacity={capacity} budget={budget} "
            f"max_rolling={sched.max_rolling} live={probe is not None}"
        )
        return RuntimeOptions(
            mode=Mode(sched.mode),
            kv_budget=budget,
            max_rolling=sched.max_rolling,
            task_retries=sched.task_retries,
            train_order=TrainOrder(sched.train_order),
            rollout_order=RolloutOrder(sched.rollout_order),
            concurrency=Concurrency(sched.concurrency),
            target_load=sched.target_load,
            rollout_timeout=cfg.rollout.request_timeout,
            kv_probe=probe,
            kv_poll_interval_s=sched.kv_poll_interval_s,
            keep_adapters=cfg.fault.keep_adapters,
            save_retries=cfg.fault.save_retries,
            on_step=on_step,
            on_eval=self.log_eval,
        )

    def start_stats(self, total_steps: int) -> None:
        """AReaL's stats logger (tensorboard/wandb/... as configured)."""
        self.stats_logger = screen.make_stats_logger(
            self.cfg, FinetuneSpec(1, total_steps, 1)
        )

    def log_step(self, r: StepRecord, stats: dict[str, float]) -> None:
        """Per committed step: a line on the screen, and the step's metrics to
        the stats logger."""
        n = self.screen.step(r)
        values: dict[str, Any] = {
            k: r[k] for k in ("reward_mean", "loss", "queue_wait_s", "train_s")
        }
        values |= {
            "version": r["version"],
            **(r.get("supervised") or {}),
            **(r.get("preference") or {}),
        }
        scalars = {
            f"marlaas/{r['task']}/{k}": float(v)
            for k, v in values.items()
            if v is not None
        }
        if self.stats_logger is not None:
            self.stats_logger.commit(0, n - 1, n - 1, {**stats, **scalars})

    def log_eval(self, r: EvalRecord, samples: list[EvalSample]) -> None:
        """Per held-out eval: a line on the screen, its reward to the stats
        logger (the samples are in the run directory)."""
        self.screen.eval(r)
        if self.stats_logger is not None and r["reward_mean"] is not None:
            # At the newest step: loggers such as wandb refuse steps that go back.
            n = max(self.screen.commits, 1) - 1
            key = f"marlaas/{r['task']}/eval_reward_mean"
            self.stats_logger.commit(0, n, n, {key: r["reward_mean"]})

    # -- shut-down ------------------------------------------------------------------
    def close(self) -> None:
        """Take down what was started, in reverse order; each part stops even
        if one before it fails (``procs.close_each``)."""
        stats, session, engine = self.stats_logger, self.session, self.engine
        scheduler = self.scheduler
        self.stats_logger = self.session = self.engine = self.scheduler = None
        parts: list[tuple[str, Callable[[], object]]] = []
        if stats is not None:
            parts.append(("the stats logger", stats.close))
        parts.append(("the reward workers", IsolatedReward.shutdown_all))
        # search.server_url=auto servers end with the run, not the interpreter.
        parts.append(("the search servers", stop_local_search_servers))
        if session is not None:
            parts.append(("the rollout session", session.stop))
        if engine is not None:
            parts.append(("the trainer", engine.destroy))
        if scheduler is not None:
            parts.append(("the workers", lambda: close_scheduler(scheduler)))
        close_each(parts, logger)
