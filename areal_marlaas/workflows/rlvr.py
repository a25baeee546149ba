"""RLVR workflow for one tenant task: routes to the task's adapter and tags output."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from areal import workflow_context
from areal.api.cli_args import GenerationHyperparameters
from areal.utils import logging, stats_tracker
from areal.utils.dynamic_import import import_from_string
from areal.workflow.rlvr import RLVRWorkflow
from transformers import PreTrainedTokenizerFast

from areal_marlaas.agents.tool_client import RolloutDiscarded
from areal_marlaas.graders.endpoint import endpoint_failure
from areal_marlaas.rollout.seeding import seeded_sampling
from areal_marlaas.trajectory import collect_served_adapters, generated_versions
from areal_marlaas.workflows.base import TaskWorkflow, grader_reward
from areal_marlaas.workflows.reward import (
    IsolatedReward,
    collect_reward_grades,
    collect_reward_reasons,
)

if TYPE_CHECKING:
    from areal_marlaas.config import FaultToleranceConfig, TaskSpec

logger = logging.getLogger("MARLaaSWorkflow")


class MultiTaskRLVRWorkflow(TaskWorkflow, RLVRWorkflow):
    """AReaL's RLVRWorkflow bound to one task.

    Requests carry ``lora_name=<task>`` so the multi-LoRA engine serves them with
    the task's current adapter; the trajectory gains ``task`` and
    ``served_adapters`` (see ``areal_marlaas.trajectory``) next to AReaL's
    per-token ``versions``, ``logprobs`` and ``rewards``.
    """

    def __init__(
        self,
        task: str,
        reward_fn: Any,
        gconfig: GenerationHyperparameters,
        tokenizer: PreTrainedTokenizerFast | str,
        enable_thinking: bool = False,
        reward_timeout_s: float | None = None,
        reward_workers: int = 2,
        sampling_seed: int | None = None,
        grader: dict | None = None,
        grading: dict | None = None,
        **kwargs: Any,
    ):
        reward_fn = grader_reward(grader, grading, reward_fn)
        super().__init__(
            reward_fn,
            gconfig.new(lora_name=task),
            tokenizer,
            enable_thinking=enable_thinking,
            **kwargs,
        )
        self.task = task
        # Set: every request gets a seed derived from it (reproducible rollouts).
        self.sampling_seed = sampling_seed
        if reward_timeout_s is not None:
            # Per-task isolated pool with a hard timeout instead of AReaL's shared
            # pool (which scores a timeout as 0 and leaves the call running).
            fn = (
                import_from_string(reward_fn)
                if isinstance(reward_fn, str)
                else reward_fn
            )
            self.reward_fn = fn
            self.async_reward_fn = IsolatedReward(
                task, fn, reward_timeout_s, reward_workers
            )

    @classmethod
    def workflow_kwargs(
        cls,
        task: TaskSpec,
        tokenizer_path: str,
        fault: FaultToleranceConfig | None = None,
        grading: dict | None = None,
    ) -> dict[str, Any]:
        kwargs = super().workflow_kwargs(task, tokenizer_path, fault, grading)
        if fault is not None:
            kwargs["reward_timeout_s"] = task.reward_timeout_s or fault.reward_timeout_s
            kwargs["reward_workers"] = fault.reward_workers
        return kwargs

    async def arun_episode(self, engine, data: dict[str, Any]) -> dict[str, Any]:
        with (
            seeded_sampling(self.sampling_seed),
            collect_served_adapters() as served,
            collect_reward_reasons() as reasons,
            collect_reward_grades() as grades,
        ):
            # AReaL's annotation says tensors only; a trajectory also carries
            # the keys set below.
            traj: dict[str, Any] = await super().arun_episode(engine, data)
        why = endpoint_failure(grades, reasons)
        if why:  # a reward service that stayed down: never a silent 0
            raise RolloutDiscarded(why)
        versions = generated_versions(traj)
        if len(versions) != 1:
            # The engine pins one version per request; several means a bug upstream.
            raise RuntimeError(
                f"task {self.task}: episode mixes adapter versions {sorted(versions)}"
            )
        scope = f"{workflow_context.stat_scope()}/{self.task}"
        stats_tracker.get(scope).scalar(reward=float(traj["rewards"].item()))
        traj["task"] = self.task
        traj["served_adapters"] = list(served)
        traj["reward_reasons"] = list(reasons)
        traj["grades"] = list(grades)
        return traj
