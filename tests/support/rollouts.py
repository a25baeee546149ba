"""Rollouts through the multi-LoRA engine against the real server: the
workflow and reward the tests use, one batch, several at once."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import requests
from areal.api.cli_args import GenerationHyperparameters, InferenceEngineConfig

from areal_marlaas.rollout.engine import MultiLoRAvLLMEngine

WORKFLOW = "areal_marlaas.workflows.rlvr.MultiTaskRLVRWorkflow"
REWARD = "areal_marlaas.tasks.rewards.numeric_answer_reward_fn"


def served_models(address: str) -> set[str]:
    data = requests.get(f"http://{address}/v1/models", timeout=10).json()["data"]
    return {m["id"] for m in data}


def rollout_engine(
    address: str, trial: str, max_concurrent: int
) -> MultiLoRAvLLMEngine:
    """A multi-LoRA rollout engine connected to the server at ``address``."""
    cfg = InferenceEngineConfig(
        experiment_name="test",
        trial_name=trial,
        backend="vllm:d1",
        use_lora=True,
        max_concurrent_rollouts=max_concurrent,
        setup_timeout=60,
        request_timeout=300,
    )
    eng = MultiLoRAvLLMEngine(cfg)
    eng.initialize(addr=address, train_data_parallel_size=1)
    return eng


def rollout(engine, task, rows, model_path, group_size=2, **gen):
    gconfig = GenerationHyperparameters(**{"max_new_tokens": 24, **gen})
    kwargs = dict(
        task=task, reward_fn=REWARD, gconfig=gconfig, tokenizer=str(model_path)
    )
    return engine.rollout_task(rows, WORKFLOW, kwargs, group_size=group_size)


def run_concurrently(fns: dict[str, Callable[[], Any]]) -> dict[str, Any]:
    """Each function on a thread of its own, all at once; their results by key
    (the first error, in key order, is raised once all have ended)."""
    with ThreadPoolExecutor(max_workers=len(fns)) as pool:
        futures = {key: pool.submit(fn) for key, fn in fns.items()}
    return {key: f.result() for key, f in futures.items()}
