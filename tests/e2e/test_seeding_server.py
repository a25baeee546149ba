"""Seeded sampling on the real vLLM server: the same tokens whatever else the
server batches, also when a prefill is chunked."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from areal.api.cli_args import GenerationHyperparameters

from areal_marlaas.rollout.seeding import RequestSeeds
from areal_marlaas.tasks.arithmetic import make_arithmetic_rows
from tests.support.rollouts import REWARD, WORKFLOW, run_concurrently
from tests.support.snapshots import trajectory_summary

pytestmark = pytest.mark.vllm


def tokens(result) -> list[list[int]]:
    return [s["output_ids"] for r in result for s in trajectory_summary(r)["samples"]]


def seeded_rollout(engine, task, rows, model_path, seed, group_size=3):
    kwargs = dict(
        task=task,
        reward_fn=REWARD,
        gconfig=GenerationHyperparameters(max_new_tokens=24, temperature=1.0),
        tokenizer=str(model_path),
        sampling_seed=seed,
    )
    return engine.rollout_task(rows, WORKFLOW, kwargs, group_size=group_size)


def test_seeded_rollout_in_a_different_batch_gives_the_same_tokens(
    engine,  # noqa: F811
    distinct_adapters,
    model_path,
):
    engine.register_task("seed_a", 0, distinct_adapters[0])
    engine.register_task("seed_b", 0, distinct_adapters[1])
    rows = make_arithmetic_rows("addition", 2, 2, seed=5)

    def seeded():
        return seeded_rollout(engine, "seed_a", rows, model_path, 11)

    alone = tokens(seeded())
    # The same rollout again, now batched with another tenant's 8 unseeded
    # sequences; new seed counters, as in a freshly started process.
    engine._engine.seeds = RequestSeeds()
    crowded = run_concurrently(
        {
            "a": seeded,
            "b": lambda: seeded_rollout(
                engine, "seed_b", rows * 2, model_path, None, 4
            ),
        }
    )
    unseeded = [
        tokens(seeded_rollout(engine, "seed_a", rows, model_path, None))
        for _ in range(2)
    ]

    assert tokens(crowded["a"]) == alone
    assert len({tuple(t) for t in alone}) > 1  # a group's samples differ
    assert unseeded[0] != unseeded[1]  # without seeds the same rollout varies


def complete(address: str, model: str, prompt: list[int], seed: int) -> list[str]:
    payload = {
        "model": model,
        "prompt": prompt,
        "max_tokens": 8,
        "temperature": 1.0,
        "seed": seed,
        "logprobs": 0,
        "return_tokens_as_token_ids": True,
    }
    r = requests.post(f"http://{address}/v1/completions", json=payload, timeout=600)
    assert r.status_code == 200, r.text[:500]
    return r.json()["choices"][0]["logprobs"]["tokens"]


def test_seeded_requests_whose_prefill_is_chunked_keep_their_tokens(
    vllm_server, model_path
):
    # vLLM's CPU server schedules 2,048 tokens a step; ten 450-token prompts sent
    # at once cannot all prefill in one step, so some are chunked. Unpatched, the
    # engine core dies there ("CPU Generator does not use offset").
    prompts = [[1] + [(17 * i + j) % 4000 + 20 for j in range(449)] for i in range(10)]
    addr, model = vllm_server.address, str(model_path)

    alone = [complete(addr, model, prompts[i], 1000 + i) for i in range(3)]
    with ThreadPoolExecutor(len(prompts)) as pool:
        together = list(
            pool.map(lambda i: complete(addr, model, prompts[i], 1000 + i), range(10))
        )

    assert together[:3] == alone  # a chunked prefill's draw was undone
