"""Reproducible sampling: per-request seeds derived from what a request is, sent to
the real vLLM server, give the same tokens whatever else the server batches."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from areal.api.cli_args import GenerationHyperparameters
from areal.api.io_struct import ModelRequest

from areal_marlaas.rollout.engine import MultiLoRAVLLMBackend
from areal_marlaas.rollout.seeding import RequestSeeds, request_seed, seeded_sampling
from areal_marlaas.tasks.arithmetic import make_arithmetic_rows
from areal_marlaas.workflows import task_workflow

from .helpers import trajectory_summary
from .test_rollout_multilora import REWARD, WORKFLOW, run_concurrently
from .test_rollout_multilora import engine as engine  # noqa: F401

PROMPT = [1, 504, 314, 1012, 2734, 30]


def draw(seeds: RequestSeeds, calls) -> list[int | None]:
    return [seeds.next(*c) for c in calls]


def test_request_seed_outside_seeded_sampling_is_none():
    assert RequestSeeds().next("a", 0, PROMPT) is None


def test_request_seeds_on_a_fresh_engine_repeat_exactly():
    calls = [("a", 0, PROMPT)] * 3 + [("b", 0, PROMPT), ("a", 0, PROMPT[:-1])]
    with seeded_sampling(7):
        first, again = draw(RequestSeeds(), calls), draw(RequestSeeds(), calls)

    assert first == again
    assert len(set(first)) == len(first)  # each sample of a group differs
    assert all(0 <= s < 2**63 for s in first)


def test_request_seed_depends_on_task_seed_and_version():
    with seeded_sampling(7):
        base = RequestSeeds().next("a", 0, PROMPT)
        other_version = RequestSeeds().next("a", 1, PROMPT)
    with seeded_sampling(8):
        other_seed = RequestSeeds().next("a", 0, PROMPT)

    assert len({base, other_version, other_seed}) == 3


def test_request_seed_counts_restart_for_a_new_version():
    seeds = RequestSeeds()
    with seeded_sampling(7):
        at_v0 = draw(seeds, [("a", 0, PROMPT)] * 2 + [("b", 0, PROMPT)])
        at_v1 = draw(seeds, [("a", 1, PROMPT)] * 2)
        b_next = seeds.next("b", 0, PROMPT)
        fresh = RequestSeeds()
        fresh_v1 = draw(fresh, [("a", 1, PROMPT)] * 2)
        fresh_b = draw(fresh, [("b", 0, PROMPT)] * 2)
        a_v0_again = seeds.next("a", 0, PROMPT)

    # A resumed process starts at v1 with no history: the same seeds.
    assert at_v1 == fresh_v1
    assert b_next == fresh_b[1]  # b's own count was kept
    assert a_v0_again == at_v0[0]  # a's v0 counts were dropped at v1


def test_generation_request_carries_the_request_seed_only_when_set():
    backend = MultiLoRAVLLMBackend()
    req = ModelRequest(
        rid="r",
        input_ids=PROMPT,
        gconfig=GenerationHyperparameters(max_new_tokens=4, lora_name="a"),
    )

    plain = backend.build_generation_request(req, True, 0).payload
    with request_seed(12345):
        seeded = backend.build_generation_request(req, True, 0).payload

    assert "seed" not in plain
    assert seeded["seed"] == 12345
    assert seeded["model"] == plain["model"] == "a-v0"


def test_deterministic_fault_config_seeds_builtin_workflows(tmp_path):
    from areal_marlaas.config import FaultToleranceConfig, TaskSpec

    spec = TaskSpec(name="add2", kind="addition", seed=5)
    _, on = task_workflow(spec, "tok", FaultToleranceConfig(deterministic=True))
    _, off = task_workflow(spec, "tok", FaultToleranceConfig())

    assert on["sampling_seed"] == 5
    assert "sampling_seed" not in off


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


@pytest.mark.vllm
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


@pytest.mark.vllm
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
