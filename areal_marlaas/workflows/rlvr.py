"""RLVR workflow for one tenant task: routes to the task's adapter and tags output."""

from __future__ import annotations

from typing import Any

from areal import workflow_context
from areal.api.cli_args import GenerationHyperparameters
from areal.utils import logging, stats_tracker
from areal.workflow.rlvr import RLVRWorkflow
from transformers import PreTrainedTokenizerFast

logger = logging.getLogger("MARLaaSWorkflow")


def generated_versions(traj: dict[str, Any]) -> set[int]:
    """The adapter versions that produced a trajectory's generated tokens."""
    mask = traj["loss_mask"].bool()
    return set(traj["versions"][mask].tolist())


class MultiTaskRLVRWorkflow(RLVRWorkflow):
    """AReaL's RLVRWorkflow bound to one task.

    Requests carry ``lora_name=<task>`` so the multi-LoRA engine serves them with
    the task's current adapter; the trajectory gains ``task`` (a string) next to
    AReaL's per-token ``versions``, ``logprobs`` and ``rewards``.
    """

    def __init__(
        self,
        task: str,
        reward_fn: Any,
        gconfig: GenerationHyperparameters,
        tokenizer: PreTrainedTokenizerFast | str,
        enable_thinking: bool = False,
        **kwargs: Any,
    ):
        super().__init__(
            reward_fn,
            gconfig.new(lora_name=task),
            tokenizer,
            enable_thinking=enable_thinking,
            **kwargs,
        )
        self.task = task

    async def arun_episode(self, engine, data: dict[str, Any]) -> dict[str, Any] | None:
        traj = await super().arun_episode(engine, data)
        versions = generated_versions(traj)
        if len(versions) != 1:
            # The engine pins one version per request; several means a bug upstream.
            logger.error(f"task {self.task}: episode mixes adapter versions {versions}")
            return None
        scope = f"{workflow_context.stat_scope()}/{self.task}"
        stats_tracker.get(scope).scalar(reward=float(traj["rewards"].item()))
        traj["task"] = self.task
        return traj


def trajectory_summary(traj: dict[str, Any]) -> dict[str, Any]:
    """Plain-Python view of one (possibly grouped) trajectory, for logs and tests."""
    mask = traj["loss_mask"].bool()
    out = []
    for i in range(traj["input_ids"].shape[0]):
        m = mask[i]
        out.append(
            {
                "output_ids": traj["input_ids"][i][m].tolist(),
                "logprobs": traj["logprobs"][i][m].tolist(),
                "versions": sorted(set(traj["versions"][i][m].tolist())),
                "reward": float(traj["rewards"][i]),
            }
        )
    return {"task": traj.get("task"), "samples": out}
