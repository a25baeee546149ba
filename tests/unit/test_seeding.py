"""Reproducible sampling: per-request seeds derived from what a request is, sent to
the real vLLM server, give the same tokens whatever else the server batches."""

from __future__ import annotations

from areal.api.cli_args import GenerationHyperparameters
from areal.api.io_struct import ModelRequest

from areal_marlaas.rollout.engine import MultiLoRAVLLMBackend
from areal_marlaas.rollout.seeding import RequestSeeds, request_seed, seeded_sampling
from areal_marlaas.workflows import task_workflow

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
