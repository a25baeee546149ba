"""Single-controller (AReaL ``scheduler.type=local|ray|slurm``) handle of the
multi-LoRA FSDP actor: its methods run on the training workers."""

from __future__ import annotations

from typing import Any

from areal.trainer.ppo.actor import PPOActorController

from areal_marlaas.rundir.records import StepResult


class MultiTaskActorController(PPOActorController):
    def add_task(self, name: str, **kwargs: Any) -> None:
        self._custom_function_call(
            "add_task", name, rpc_meta={"broadcast": True}, **kwargs
        )

    def train_task(
        self,
        name: str,
        batch: list[dict[str, Any]],
        valid: list[dict[str, Any]] | None = None,
    ) -> StepResult:
        # Trajectories are split across data-parallel heads; tensors still on the
        # rollout workers (RTensors) are fetched by the training workers.
        out = self._custom_function_call(
            "train_task", name, batch, rpc_meta={"broadcast": True}, valid=valid
        )
        # Tensor-like arguments make the dispatcher return one result per
        # trajectory group; every rank reports the same reduced stats.
        while isinstance(out, list):
            out = out[0]
        return out

    def save_adapter(self, name: str, path: str) -> str:
        return self._custom_function_call(
            "save_adapter", name, path, rpc_meta={"broadcast": True}
        )

    def release_batch(self, batch: list[dict[str, Any]]) -> None:
        """Free the batch's tensors on the rollout workers."""
        self.clear_batches(*batch)

    def remove_task(self, name: str) -> None:
        self._custom_function_call("remove_task", name, rpc_meta={"broadcast": True})

    def save_task_state(self, name: str, path: str) -> str:
        return self._custom_function_call(
            "save_task_state", name, path, rpc_meta={"broadcast": True}
        )
