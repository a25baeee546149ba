"""RLVR workflow for one tenant task: routes to the task's adapter and tags output."""

from __future__ import annotations

from typing import Any

from areal import workflow_context
from areal.api.cli_args import GenerationHyperparameters
from areal.utils import logging, stats_tracker
from areal.utils.dynamic_import import import_from_string
from areal.workflow.rlvr import RLVRWorkflow
from transformers import PreTrainedTokenizerFast

from areal_marlaas.rollout.seeding import seeded_sampling
from areal_marlaas.workflows.reward import IsolatedReward

logger = logging.getLogger("MARLaaSWorkflow")

# The last error of an episode per task (this process), so a rollout whose
# episodes all failed can say why (AReaL's executor logs it and returns None).
_LAST_ERROR: dict[str, str] = {}


def last_episode_error(task: str) -> str:
    return _LAST_ERROR.get(task, "")


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
        reward_timeout_s: float | None = None,
        reward_workers: int = 2,
        sampling_seed: int | None = None,
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

    async def arun_episode(self, engine, data: dict[str, Any]) -> dict[str, Any] | None:
        try:
            with seeded_sampling(self.sampling_seed):
                traj = await super().arun_episode(engine, data)
        except Exception as e:
            _LAST_ERROR[self.task] = f"{type(e).__name__}: {e}"
            raise
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
