"""How a task's settings become a workflow's constructor arguments.

The workflow class declares it (``workflow_kwargs``), so a user's subclass of a
built-in workflow keeps what the built-in gets (reward timeouts, seeding, a kind's
environment settings). Import strings and kwargs cross AReaL's RPC boundary;
workflow instances would not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from areal.api.cli_args import GenerationHyperparameters

if TYPE_CHECKING:
    from areal_marlaas.config import FaultToleranceConfig, TaskSpec


def task_gconfig(task: TaskSpec) -> GenerationHyperparameters:
    return GenerationHyperparameters(
        n_samples=1,
        max_new_tokens=task.max_new_tokens,
        temperature=task.temperature,
        lora_name=task.name,
    )


def base_kwargs(task: TaskSpec, tokenizer_path: str) -> dict[str, Any]:
    """What every task workflow takes: its task, reward, sampling, tokenizer."""
    return {
        "task": task.name,
        "reward_fn": task.reward_fn_path,
        "gconfig": task_gconfig(task),
        "tokenizer": tokenizer_path,
    }


def grader_reward(grader: dict | None, grading: dict | None, reward_fn: Any) -> Any:
    """The reward a workflow scores with: the task's grader when it has one."""
    if grader is None:
        return reward_fn
    from areal_marlaas.graders import GraderReward

    return GraderReward(grader, grading)


class TaskWorkflow:
    """Mixin of the plugin's workflows: they are bound to one task."""

    @classmethod
    def workflow_kwargs(
        cls,
        task: TaskSpec,
        tokenizer_path: str,
        fault: FaultToleranceConfig | None = None,
        grading: dict | None = None,
    ) -> dict[str, Any]:
        """``grading``: the graders' environment (``GradingContext.to_dict()``)."""
        kwargs = base_kwargs(task, tokenizer_path)
        if fault is not None and fault.deterministic:
            kwargs["sampling_seed"] = task.seed
        if task.grader is not None:
            kwargs["grader"] = dict(task.grader)
            kwargs["grading"] = grading
        return kwargs
