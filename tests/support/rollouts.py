"""Rollouts through the multi-LoRA engine against the real server: the
workflow and reward the tests use, one batch, several at once."""

from __future__ import annotations

import threading

import requests
from areal.api.cli_args import GenerationHyperparameters

WORKFLOW = "areal_marlaas.workflows.rlvr.MultiTaskRLVRWorkflow"
REWARD = "areal_marlaas.tasks.rewards.numeric_answer_reward_fn"


def served_models(address: str) -> set[str]:
    data = requests.get(f"http://{address}/v1/models", timeout=10).json()["data"]
    return {m["id"] for m in data}


def rollout(engine, task, rows, model_path, group_size=2, **gen):
    gconfig = GenerationHyperparameters(**{"max_new_tokens": 24, **gen})
    kwargs = dict(
        task=task, reward_fn=REWARD, gconfig=gconfig, tokenizer=str(model_path)
    )
    return engine.rollout_task(rows, WORKFLOW, kwargs, group_size=group_size)


def run_concurrently(fns: dict[str, callable]) -> dict:
    results, errors = {}, []

    def call(key, fn):
        try:
            results[key] = fn()
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=call, args=kv) for kv in fns.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results
