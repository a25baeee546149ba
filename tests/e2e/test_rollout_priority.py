"""Fair rollouts on the real server: a tenant's rollout sent at a lower priority
than another tenant's huge batch is served before that batch ends
(``scheduler.rollout_order=fair`` runs the server with priority scheduling)."""

from __future__ import annotations

import threading
import time

import pytest
from areal.api.cli_args import GenerationHyperparameters

from areal_marlaas.rollout.server_metrics import scrape
from areal_marlaas.tasks.arithmetic import make_arithmetic_rows
from areal_marlaas.trajectory import failure_reason
from tests.support.leases import LeaseLog
from tests.support.rollouts import rollout_engine
from tests.support.snapshots import ok

# Its own server (~30 s to start) and two batches: run by make test-live.
pytestmark = [pytest.mark.vllm, pytest.mark.slow]

WORKFLOW = "areal_marlaas.workflows.rlvr.MultiTaskRLVRWorkflow"
REWARD = "areal_marlaas.tasks.rewards.numeric_answer_reward_fn"


@pytest.fixture(scope="module")
def priority_server(model_path, tmp_path_factory):
    """A server that batches 2 sequences at a time, so requests queue."""
    from areal_marlaas.rollout.server import (
        MultiLoRAvLLMConfig,
        RolloutServerConfig,
        VLLMServer,
    )

    vllm_cfg = MultiLoRAvLLMConfig(
        max_loras=2,
        max_cpu_loras=4,
        max_lora_rank=8,
        max_model_len=512,
        max_num_seqs=2,
        scheduling_policy="priority",
    )
    log = tmp_path_factory.mktemp("vllm-priority") / "server.log"
    server = VLLMServer(
        str(model_path), vllm_cfg, RolloutServerConfig(cpu_kvcache_space_gib=1), log
    )
    server.start()
    yield server
    server.stop()


@pytest.fixture
def engine(priority_server, distinct_adapters):
    eng = rollout_engine(priority_server.address, "priority", 64)
    eng.register_task("heavy", 0, distinct_adapters[0])
    eng.register_task("light", 0, distinct_adapters[1])
    yield eng
    eng.destroy()


def rollout(engine, task, rows, model_path, group_size, tokens):
    gconfig = GenerationHyperparameters(
        max_new_tokens=tokens, min_new_tokens=tokens, ignore_eos=True
    )
    kwargs = dict(
        task=task, reward_fn=REWARD, gconfig=gconfig, tokenizer=str(model_path)
    )
    return engine.rollout_task(rows, WORKFLOW, kwargs, group_size=group_size)


def light_behind_heavy(engine, address, model_path, heavy_priority: int):
    """A heavy batch of 8 sequences (32 tokens each: 4 rounds of the server's 2
    slots), and a light rollout (1 x 8 tokens) sent once the heavy batch runs:
    how many heavy sequences the server had finished when the light one was
    sent, and how many had returned before it did (the order in which the
    engine's requests ended)."""
    engine.set_priority("heavy", heavy_priority)
    engine.set_priority("light", 0)
    heavy_rows = make_arithmetic_rows("addition", 4, 2, seed=1)
    light_rows = make_arithmetic_rows("addition", 1, 2, seed=2)
    engine.adapters.listener = log = LeaseLog()
    out: dict[str, list] = {}

    def heavy():
        out["heavy"] = rollout(engine, "heavy", heavy_rows, model_path, 2, 32)

    before = scrape(address)
    thread = threading.Thread(target=heavy)
    thread.start()
    # Send the light rollout once the heavy batch has begun decoding (a counter:
    # a slow poll sees it late, but cannot miss it).
    deadline = time.monotonic() + 120
    while True:
        m = scrape(address)
        if m.generation_tokens > before.generation_tokens:
            break
        if not thread.is_alive():
            why = [failure_reason(t) for t in out.get("heavy", [])]
            pytest.fail(f"the heavy batch ended before it was seen decoding: {why}")
        assert time.monotonic() < deadline, "the heavy batch never ran"
        time.sleep(0.05)
    # Half the heavy batch still to run, or the light rollout has nothing to
    # overtake (its requests end 32 decode steps after they start).
    finished = m.requests_finished - before.requests_finished
    assert finished <= 4, f"seen late: {finished} heavy requests done"
    out["light"] = rollout(engine, "light", light_rows, model_path, 1, 8)
    thread.join()
    assert all(ok(t) for t in out["heavy"] + out["light"])
    assert len(log.leases) == 9, log.leases
    assert all(end is not None for _, _, end in log.leases), log.leases
    ends = sorted((end, name) for name, _, end in log.leases)
    return int(finished), [name for _, name in ends].index("light-v0")


def test_a_lower_priority_number_overtakes_a_queued_heavy_batch(
    engine, priority_server, model_path
):
    address = priority_server.address
    for task in ("heavy", "light"):  # both adapters loaded, kernels warm
        rows = make_arithmetic_rows("addition", 1, 2, seed=3)
        assert all(ok(t) for t in rollout(engine, task, rows, model_path, 2, 4))
    # Same priority: first come, first served. The light request waits behind
    # the whole heavy batch and gets a slot only once 7 heavy sequences have
    # ended (the regression fair rollouts remove).
    _, same = light_behind_heavy(engine, address, model_path, heavy_priority=0)
    # Heavy at 1000: the light request takes the first slot that frees (one more
    # heavy sequence ends), and one more may end on the other slot while its 8
    # tokens run.
    sent, fair = light_behind_heavy(engine, address, model_path, heavy_priority=1000)
    print(f"heavy sequences ended before light: same priority {same}; fair {fair}")
    assert same >= 7
    assert fair <= sent + 2 <= 6
