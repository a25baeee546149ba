"""AReaL rollout workflows bound to one tenant task: single-turn RLVR and the
multi-turn search agent, and how a task's spec picks one and its arguments."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from areal.utils import logging
from areal.utils.dynamic_import import import_from_string

from areal_marlaas.tasks import KINDS
from areal_marlaas.workflows.base import base_kwargs

if TYPE_CHECKING:
    from areal_marlaas.config import FaultToleranceConfig, TaskSpec

logger = logging.getLogger("MARLaaSWorkflow")

RLVR_WORKFLOW = "areal_marlaas.workflows.rlvr.MultiTaskRLVRWorkflow"
AGENT_WORKFLOW = "areal_marlaas.workflows.tool_agent.ToolAgentWorkflow"


def workflow_path(task: TaskSpec) -> str:
    kind = KINDS.get(task.kind)
    if task.agent.enabled:
        return AGENT_WORKFLOW
    return task.workflow or (kind.workflow if kind else "") or RLVR_WORKFLOW


def task_workflow(
    task: TaskSpec,
    tokenizer_path: str,
    fault: FaultToleranceConfig | None = None,
    grading: dict | None = None,
) -> tuple[str, dict[str, Any]]:
    """Import path + constructor kwargs of the task's workflow. The class says
    what it takes (``workflow_kwargs``); a foreign workflow gets the basics."""
    path = workflow_path(task)
    cls = import_from_string(path)
    declared = getattr(cls, "workflow_kwargs", None)
    if declared is not None:
        return path, declared(task, tokenizer_path, fault, grading)
    if task.grader is not None:
        raise ValueError(
            f"task {task.name}: {path} does not take a grader (only the plugin's "
            "workflows do); give it a reward_fn"
        )
    if fault is not None and fault.deterministic:
        logger.warning(
            f"task {task.name}: fault.deterministic seeds only the plugin's "
            f"workflows; {path} samples unseeded unless it runs its episodes "
            "inside areal_marlaas.rollout.seeding.seeded_sampling(seed)"
        )
    return path, base_kwargs(task, tokenizer_path)
