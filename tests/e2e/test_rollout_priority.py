"""Fair rollouts on the real server: a tenant's rollout sent at a lower priority
than another tenant's huge batch is served before that batch ends
(``scheduler.rollout_order=fair`` runs the server with priority scheduling)."""

from __future__ import annotations

import threading
import time

import pytest
from areal.api.cli_args import GenerationHyperparameters, InferenceEngineConfig

from areal_marlaas.rollout.engine import MultiLoRAvLLMEngine
from areal_marlaas.rollout.server_metrics import scrape
from areal_marlaas.tasks.arithmetic import make_arithmetic_rows
from areal_marlaas.trajectory import failure_reason
from tests.helpers import ok

# Its own server (~1 min to start) and two ~30 s batches: run by make test-service.
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
    cfg = InferenceEngineConfig(
        experiment_name="test",
        trial_name="priority",
        backend="vllm:d1",
        use_lora=True,
        max_concurrent_rollouts=64,
        setup_timeout=60,
        request_timeout=300,
    )
    eng = MultiLoRAvLLMEngine(cfg)
    eng.initialize(addr=priority_server.address, train_data_parallel_size=1)
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
    """Seconds from the start of a heavy batch (8 sequences x 32 tokens, 4 rounds
    of the server's 2 slots) until the light rollout (1 x 8 tokens, sent once the
    heavy batch runs) and the heavy batch return."""
    engine.set_priority("heavy", heavy_priority)
    engine.set_priority("light", 0)
    heavy_rows = make_arithmetic_rows("addition", 4, 2, seed=1)
    light_rows = make_arithmetic_rows("addition", 1, 2, seed=2)
    done: dict[str, float] = {}
    out: dict[str, list] = {}
    t0 = time.monotonic()

    def heavy():
        out["heavy"] = rollout(engine, "heavy", heavy_rows, model_path, 2, 32)
        done["heavy"] = time.monotonic() - t0

    before = scrape(address)
    thread = threading.Thread(target=heavy)
    thread.start()
    # Send the light rollout once the heavy batch has begun decoding. The
    # generation counter cannot be missed between two polls, as a gauge can.
    trace = []
    deadline = time.monotonic() + 120
    while True:
        m = scrape(address)
        trace.append((round(time.monotonic() - t0, 2), m.requests_running))
        if m.generation_tokens > before.generation_tokens:
            break
        if not thread.is_alive():
            why = [failure_reason(t) for t in out.get("heavy", [])]
            pytest.fail(f"the heavy batch ended unseen: {why}; polls {trace}")
        assert time.monotonic() < deadline, f"the heavy batch never ran: {trace}"
        time.sleep(0.05)
    # Half the heavy batch still to run, or the light rollout has nothing to overtake.
    finished = m.requests_finished - before.requests_finished
    assert finished <= 4, f"seen late: {finished} heavy requests done; polls {trace}"
    out["light"] = rollout(engine, "light", light_rows, model_path, 1, 8)
    done["light"] = time.monotonic() - t0
    thread.join()
    assert all(ok(t) for t in out["heavy"] + out["light"])
    return done


def test_a_lower_priority_number_overtakes_a_queued_heavy_batch(
    engine, priority_server, model_path
):
    address = priority_server.address
    # Same priority: first come, first served; the light rollout waits for the
    # whole heavy batch (the regression fair rollouts remove).
    for task in ("heavy", "light"):  # both adapters loaded, kernels warm
        rows = make_arithmetic_rows("addition", 1, 2, seed=3)
        assert all(ok(t) for t in rollout(engine, task, rows, model_path, 2, 4))
    same = light_behind_heavy(engine, address, model_path, heavy_priority=0)
    fair = light_behind_heavy(engine, address, model_path, heavy_priority=1000)
    print(f"same priority: {same}; heavy at 1000: {fair}")
    assert same["light"] > same["heavy"] * 0.9
    # Served in the first free slot: about a quarter of the heavy batch's time.
    assert fair["light"] < fair["heavy"] * 0.6
