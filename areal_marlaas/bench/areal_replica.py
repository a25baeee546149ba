"""One tenant's task through AReaL's own PPOTrainer, with its own vLLM server: the
replicated baseline of ``marlaas bench`` (what a platform runs today, one AReaL
job per tenant). The path of ``examples/single_task_ppotrainer.py`` (on-policy:
``rollout.max_head_offpolicyness: 0`` and an actor that refuses stale batches),
fed the task's own rows, reward and GRPO settings.

    python -m areal_marlaas.bench.areal_replica --task-file T.yaml \
        --config examples/single_task_ppotrainer.yaml [AReaL overrides ...]

``--task-file`` holds one ``TaskSpec`` (the bench writes it); the bench sets the
AReaL overrides that mirror it (steps, batch, group, tokens, lr, seed).
``$MARLAAS_REPLICA_KV_GIB`` sizes this replica's vLLM KV cache.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import areal.engine
import areal.trainer.rl_trainer as rl_trainer
from areal.api.cli_args import GRPOConfig, InferenceEngineConfig, load_expr_config
from areal.trainer.rl_trainer import PPOTrainer
from datasets import Dataset
from omegaconf import OmegaConf

from areal_marlaas.config import TaskSpec
from areal_marlaas.config.server import RolloutServerConfig
from areal_marlaas.model_prep import prepare_default_model
from areal_marlaas.rollout.engine import SingleTaskvLLMEngine
from areal_marlaas.tasks import KINDS, load_task_rows
from areal_marlaas.train.engine import OnPolicyFSDPPPOActor


class ReplicaEngine(SingleTaskvLLMEngine):
    """The example's engine, its server's KV cache sized for one tenant."""

    def __init__(
        self, config: InferenceEngineConfig, server: RolloutServerConfig | None = None
    ):
        kv = os.environ.get("MARLAAS_REPLICA_KV_GIB")
        if server is None and kv:
            server = RolloutServerConfig(cpu_kvcache_space_gib=float(kv))
        super().__init__(config, server)


def task_arguments(spec: TaskSpec) -> list[str]:
    """AReaL overrides that give the replica the task's settings."""
    return [
        f"seed={spec.seed}",
        f"total_train_steps={spec.total_steps}",
        "total_train_epochs=1000",  # the step count stops it
        f"train_dataset.batch_size={spec.batch_size}",
        f"gconfig.lora_name={spec.name}",
        f"gconfig.n_samples={spec.n_samples}",
        f"gconfig.max_new_tokens={spec.max_new_tokens}",
        f"gconfig.temperature={spec.temperature}",
        f"actor.optimizer.lr={spec.lr}",
    ]


def load_spec(path: str) -> TaskSpec:
    raw = OmegaConf.merge(OmegaConf.structured(TaskSpec), OmegaConf.load(path))
    return OmegaConf.to_object(raw)  # type: ignore[return-value]


def main(argv: list[str]) -> None:
    if "--task-file" not in argv:
        raise SystemExit("--task-file T.yaml (one TaskSpec) is required")
    i = argv.index("--task-file")
    spec = load_spec(argv[i + 1])
    argv = argv[:i] + argv[i + 2 :]
    # By its module's name: AReaL's workers import the engine class by path,
    # and this file runs as __main__.
    from areal_marlaas.bench import areal_replica

    # areal.engine exports its classes lazily (a module __getattr__).
    areal.engine.FSDPPPOActor = OnPolicyFSDPPPOActor  # pyright: ignore[reportAttributeAccessIssue]
    rl_trainer.RemotevLLMEngine = areal_replica.ReplicaEngine
    config, _ = load_expr_config(argv, GRPOConfig)
    if not config.actor.path:
        config.actor.path = config.tokenizer_path = str(prepare_default_model())
        config.vllm.model = config.actor.path
    kind = KINDS[spec.kind]
    workflow_kwargs: dict[str, Any] = dict(
        task=spec.name,
        reward_fn=kind.reward_fn,
        gconfig=config.gconfig,
        tokenizer=config.tokenizer_path,
    )
    with PPOTrainer(config, train_dataset=Dataset.from_list(load_task_rows(spec))) as t:
        t.train(
            workflow="areal_marlaas.workflows.rlvr.MultiTaskRLVRWorkflow",
            workflow_kwargs=workflow_kwargs,
        )


if __name__ == "__main__":
    main(sys.argv[1:])
