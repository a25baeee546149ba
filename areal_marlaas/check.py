"""``marlaas check``: everything that can be validated without starting anything.

The dataclass ``__post_init__`` hooks catch what the config alone shows; this adds
what needs the disk: the model, each task's dataset, reward function and workflow,
and whether each task's rollout batch can ever fit in the server's KV cache.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path

from areal.api.workflow_api import RolloutWorkflow
from areal.utils.dynamic_import import import_from_string

from areal_marlaas.admission import KVModel, task_kv_bytes
from areal_marlaas.config import ConfigError, MARLaaSConfig, TaskSpec
from areal_marlaas.rollout.server import detect_platform, server_block_size
from areal_marlaas.scheduler.core import (
    AdmissionError,
    HoldRollout,
    SchedulerCore,
    StartRollout,
    Submitted,
)
from areal_marlaas.tasks import load_task_rows


@dataclass
class TaskReport:
    name: str
    kind: str
    rows: int
    reward_fn: str
    kv_bytes: int


def _import(where: str, path: str):
    try:
        return import_from_string(path)
    except (ImportError, AttributeError, ValueError) as e:
        raise ConfigError(f"{where}: cannot import {path!r} ({e}).") from e


def server_platform(cfg: MARLaaSConfig) -> str:
    return detect_platform() if cfg.server.platform == "auto" else cfg.server.platform


def kv_model(cfg: MARLaaSConfig) -> KVModel:
    block = server_block_size(cfg.vllm.block_size, server_platform(cfg))
    return KVModel.from_model_dir(cfg.actor.path, cfg.vllm.dtype, block)


def kv_capacity_bytes(cfg: MARLaaSConfig) -> int | None:
    """The KV cache a launched CPU server gets; None when only the server knows."""
    if cfg.server.addresses or server_platform(cfg) != "cpu":
        return None
    return int(cfg.server.cpu_kvcache_space_gib * 2**30)


def check_task(i: int, task: TaskSpec, kv: KVModel, capacity: int | None) -> TaskReport:
    where = f"tasks.{i} ({task.name!r})"
    rows = load_task_rows(task) if task.kind else []
    reward = _import(f"{where} reward_fn", task.reward_fn_path)
    if not callable(reward):
        raise ConfigError(
            f"{where}: reward_fn {task.reward_fn_path!r} is not callable."
        )
    if task.workflow:
        wf = _import(f"{where} workflow", task.workflow)
        if not (inspect.isclass(wf) and issubclass(wf, RolloutWorkflow)):
            raise ConfigError(
                f"{where}: workflow {task.workflow!r} is not a RolloutWorkflow "
                "subclass."
            )
    need = task_kv_bytes(
        kv, task.max_prompt_tokens, task.max_new_tokens, task.batch_size, task.n_samples
    )
    if capacity is not None and need > capacity:
        raise ConfigError(
            f"{where}: batch_size x n_samples = {task.batch_size * task.n_samples} "
            f"sequences of up to {task.max_prompt_tokens + task.max_new_tokens} tokens "
            f"need {need / 2**30:.2f} GiB of KV cache, but the server holds "
            f"{capacity / 2**30:.2f} GiB (server.cpu_kvcache_space_gib), so this batch "
            "can never be admitted; lower batch_size, n_samples or max_new_tokens, or "
            "give the server more KV cache."
        )
    return TaskReport(
        task.name, task.kind or task.workflow, len(rows), task.reward_fn_path, need
    )


def config_kv_budget(cfg: MARLaaSConfig) -> int | None:
    """The budget the config implies before any server is asked (None = unknown
    until the server reports its capacity)."""
    sched = cfg.scheduler
    if sched.kv_budget_bytes:
        return sched.kv_budget_bytes
    capacity = kv_capacity_bytes(cfg)
    return None if capacity is None else int(capacity * sched.kv_budget_fraction)


@dataclass
class AdmissionPlan:
    budget: int | None
    admitted: list[str]
    held: dict[str, str]  # task -> reason


def admission_plan(cfg: MARLaaSConfig, reports: list[TaskReport]) -> AdmissionPlan:
    """Which tasks the scheduler admits at the start and which it holds, as the
    pure core decides it for this config."""
    budget = config_kv_budget(cfg)
    core = SchedulerCore(
        mode=cfg.scheduler.mode, kv_budget=budget, max_rolling=cfg.scheduler.max_rolling
    )
    plan = AdmissionPlan(budget, [], {})
    for i, (task, r) in enumerate(zip(cfg.tasks, reports)):
        try:
            actions = core.handle(
                Submitted(r.name, task.total_steps, 0, r.kv_bytes, task.priority)
            )
        except AdmissionError as e:
            raise ConfigError(f"tasks.{i} ({task.name!r}): {e}") from e
        for a in actions:
            if isinstance(a, StartRollout):
                plan.admitted.append(a.task)
                plan.held.pop(a.task, None)
            elif isinstance(a, HoldRollout):
                plan.held[a.task] = a.reason
    return plan


def check_config(cfg: MARLaaSConfig) -> list[TaskReport]:
    """Raise ``ConfigError`` on the first problem; return a per-task report."""
    model = Path(cfg.actor.path)
    if not (model / "config.json").is_file():
        raise ConfigError(
            f"actor.path: {model} is not a model folder (no config.json); run "
            "`marlaas prepare-model` or point actor.path at a HF model folder."
        )
    kv = kv_model(cfg)
    capacity = kv_capacity_bytes(cfg)
    reports = [check_task(i, t, kv, capacity) for i, t in enumerate(cfg.tasks)]
    admission_plan(cfg, reports)  # a batch over the budget is refused here
    return reports
