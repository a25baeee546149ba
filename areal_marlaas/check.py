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

from areal_marlaas import admission
from areal_marlaas.admission import KVModel
from areal_marlaas.config import ConfigError, MARLaaSConfig, TaskSpec
from areal_marlaas.methods import Method
from areal_marlaas.methods.examples import check_row
from areal_marlaas.scheduler.core import (
    AdmissionError,
    Concurrency,
    HoldRollout,
    Mode,
    SchedulerCore,
    StartRollout,
    Submitted,
)
from areal_marlaas.tasks import load_task_rows
from areal_marlaas.tasks.records import read_records


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


def _check_examples(where: str, task: TaskSpec) -> TaskReport:
    """A task that trains on its own examples: each row by its method's rules."""
    method = Method(task.method)
    try:
        rows = read_records(task.dataset.path, task.dataset.split)
        for n, row in enumerate(rows, 1):
            check_row(method, row, f"{task.dataset.path}:{n}")
    except (OSError, ValueError) as e:
        raise ConfigError(f"{where}: dataset: {e}") from e
    return TaskReport(task.name, method.value, len(rows), "-", 0)


def check_task(i: int, task: TaskSpec, kv: KVModel, capacity: int | None) -> TaskReport:
    where = f"tasks.{i} ({task.name!r})"
    if not Method(task.method).rolls_out:
        return _check_examples(where, task)
    rows = load_task_rows(task)
    reward = _import(f"{where} reward_fn", task.reward_fn_path)
    if task.grader is None and not callable(reward):
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
    need = kv.task_bytes(task)
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


@dataclass
class AdmissionPlan:
    budget: int | None
    admitted: list[str]
    held: dict[str, str]  # task -> reason


def admission_plan(cfg: MARLaaSConfig, reports: list[TaskReport]) -> AdmissionPlan:
    """Which tasks the scheduler admits at the start and which it holds, as the
    pure core decides it for this config."""
    budget = admission.budget(cfg, admission.configured_capacity(cfg))
    core = SchedulerCore(
        mode=Mode(cfg.scheduler.mode),
        kv_budget=budget,
        max_rolling=cfg.scheduler.max_rolling,
        trainers=cfg.scheduler.trainers,
        concurrency=Concurrency(cfg.scheduler.concurrency),
        target_load=cfg.scheduler.target_load,
    )
    plan = AdmissionPlan(budget, [], {})
    for i, (task, r) in enumerate(zip(cfg.tasks, reports, strict=True)):
        try:
            actions = core.handle(
                Submitted(
                    r.name,
                    task.total_steps,
                    0,
                    r.kv_bytes,
                    task.priority,
                    rollout=Method(task.method).rolls_out,
                )
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


def check_config(
    cfg: MARLaaSConfig, task_errors: dict[str, str] | None = None
) -> list[TaskReport]:
    """Raise ``ConfigError`` on the first problem; return a per-task report.

    With ``task_errors`` (``marlaas train``), a problem of one task (its dataset,
    reward function, workflow or KV need) is recorded there under the task's name
    instead, so that task fails at start and the others still run."""
    model = Path(cfg.actor.path)
    if not (model / "config.json").is_file():
        raise ConfigError(
            f"actor.path: {model} is not a model folder (no config.json); run "
            "`marlaas prepare-model` or point actor.path at a HF model folder."
        )
    kv = KVModel.for_config(cfg)
    capacity = admission.configured_capacity(cfg)
    reports = []
    for i, task in enumerate(cfg.tasks):
        try:
            reports.append(check_task(i, task, kv, capacity))
        except ConfigError as e:
            if task_errors is None:
                raise
            task_errors[task.name] = str(e)
    if not task_errors:  # (the plan pairs reports with cfg.tasks one to one)
        admission_plan(cfg, reports)  # a batch over the budget is refused here
    return reports
