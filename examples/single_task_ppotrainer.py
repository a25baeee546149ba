"""One task through AReaL's own PPOTrainer, with the plugin's pieces plugged in.

    python examples/single_task_ppotrainer.py \
        --config examples/single_task_ppotrainer.yaml

AReaL picks its engine classes by name; two assignments swap in the plugin's:
  * the FSDP actor with the packed-attention mask fix (AReaL's mask is wrong on
    CPU/sdpa), and
  * the multi-LoRA vLLM engine, which launches vLLM's own server from the vLLM venv
    and publishes each LoRA version under a new name without pausing the server.
The workflow is the plugin's task-routing RLVR workflow. Everything else (data
loading, GRPO, weight updates, saving, stats) is stock AReaL.
"""

from __future__ import annotations

import sys

import areal.engine
import areal.trainer.rl_trainer as rl_trainer
from areal.api.cli_args import GRPOConfig, load_expr_config
from areal.trainer.rl_trainer import PPOTrainer
from datasets import Dataset

from areal_marlaas.models import prepare_default_model
from areal_marlaas.rollout.engine import MultiLoRAvLLMEngine
from areal_marlaas.tasks.arithmetic import make_arithmetic_rows
from areal_marlaas.train.engine import CPUFixedFSDPPPOActor

areal.engine.FSDPPPOActor = CPUFixedFSDPPPOActor
rl_trainer.RemotevLLMEngine = MultiLoRAvLLMEngine


def main(argv: list[str]) -> None:
    config, _ = load_expr_config(argv, GRPOConfig)
    if not config.actor.path:
        config.actor.path = config.tokenizer_path = str(prepare_default_model())
        config.vllm.model = config.actor.path
    rows = make_arithmetic_rows("addition", 256, 1, seed=config.seed)
    dataset = Dataset.from_list(rows)
    workflow_kwargs = dict(
        task=config.gconfig.lora_name,
        reward_fn="areal_marlaas.tasks.rewards.numeric_answer_reward_fn",
        gconfig=config.gconfig,
        tokenizer=config.tokenizer_path,
    )
    with PPOTrainer(config, train_dataset=dataset) as trainer:
        trainer.train(
            workflow="areal_marlaas.workflows.rlvr.MultiTaskRLVRWorkflow",
            workflow_kwargs=workflow_kwargs,
        )


if __name__ == "__main__":
    main(sys.argv[1:])
