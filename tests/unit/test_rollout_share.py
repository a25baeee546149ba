"""Fair shares of the rollout server (scheduler.rollout_order=fair): the
priorities the core gives rollouts, checked against a model of a server that
serves waiting batches by (priority, arrival), and the priority on the wire."""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass

import pytest

from areal_marlaas.rollout import engine as engine_module
from areal_marlaas.rollout.engine import MultiLoRAVLLMBackend
from areal_marlaas.scheduler.core import (
    RolloutDone,
    SchedulerCore,
    StartRollout,
    Submitted,
)
from areal_marlaas.scheduler.rollout_share import RolloutShare


@dataclass
class Task:
    name: str
    tenant: str
    weight: float = 1.0


def serve(tasks: list[Task], tokens: dict[str, int], share: RolloutShare, n: int):
    """A server that runs one batch at a time, the waiting batch with the lowest
    (priority, arrival) first; every task resubmits as soon as its batch
    returns (all backlogged). Returns each tenant's served tokens after each
    batch."""
    waiting: list[tuple[int, int, int]] = []
    arrival = 0
    for t in tasks:
        share.join(t)
    for i, t in enumerate(tasks):
        heapq.heappush(waiting, (share.start(t), arrival, i))
        arrival += 1
    served: dict[str, int] = {t.tenant: 0 for t in tasks}
    history = []
    for _ in range(n):
        _, _, i = heapq.heappop(waiting)
        t = tasks[i]
        share.end(t, tokens[t.name])
        served[t.tenant] += tokens[t.name]
        history.append(dict(served))
        heapq.heappush(waiting, (share.start(t), arrival, i))
        arrival += 1
    return history


def test_a_heavy_tenant_does_not_crowd_out_light_ones():
    # One heavy tenant (8x the tokens per batch) and three light ones, each
    # with one task always waiting: FIFO would give the heavy one 8/11 of the
    # tokens; the fair order gives each tenant the same, within one batch.
    tasks = [Task("h", "heavy")] + [Task(f"l{i}", f"light{i}") for i in range(3)]
    tokens = {"h": 800, "l0": 100, "l1": 100, "l2": 100}
    history = serve(tasks, tokens, RolloutShare(), 400)
    final = history[-1]
    assert max(final.values()) - min(final.values()) <= 2 * 800
    for served in history[20:]:
        assert max(served.values()) - min(served.values()) <= 2 * 800, served


@pytest.mark.parametrize("seed", range(5))
def test_backlogged_tenants_weighted_tokens_stay_within_two_batches(seed):
    rng = random.Random(seed)
    weights = {f"t{i}": rng.choice([1.0, 2.0, 3.0]) for i in range(5)}
    tasks = [
        Task(f"{tenant}-{j}", tenant, w)
        for tenant, w in weights.items()
        for j in range(rng.randint(1, 3))
    ]
    tokens = {t.name: rng.randint(10, 500) for t in tasks}
    history = serve(tasks, tokens, RolloutShare(), 1500)
    biggest = max(tokens[t.name] / t.weight for t in tasks)
    for served in history[100:]:
        weighted = [served[t] / weights[t] for t in weights]
        # Each tenant may have one batch per task in flight at a fixed priority.
        slack = max(len([t for t in tasks if t.tenant == x]) for x in weights) + 1
        assert max(weighted) - min(weighted) <= slack * biggest, served


def test_a_weight_2_tenant_gets_twice_the_tokens():
    tasks = [Task("a", "a", 2.0), Task("b", "b", 1.0)]
    history = serve(tasks, {"a": 100, "b": 100}, RolloutShare(), 900)
    ratio = history[-1]["a"] / history[-1]["b"]
    assert ratio == pytest.approx(2.0, rel=0.1)


def test_a_tenant_returning_from_idle_is_lifted_not_ahead_by_its_idle_time():
    share = RolloutShare()
    busy, back = Task("busy", "busy"), Task("back", "back")
    share.join(busy)
    share.join(back)
    share.start(back)  # one early batch, then it leaves (paused)
    share.end(back, 0)
    share.leave(back)
    for _ in range(50):
        share.start(busy)
        share.end(busy, 100)
    share.start(busy)  # in flight: its tenant rolls out now
    share.join(back)  # resumed
    p = share.start(back)
    # Lifted to the busy tenant's charged count (5000): not 0 (the credit of
    # 50 batches idle), not behind the busy tenant's batch in flight either.
    assert p == 5000
    share.end(back, 100)
    assert share.start(back) > 5000  # its own batch counts from there


def test_a_tenant_that_demanded_little_goes_first_but_within_two_batches():
    share = RolloutShare()
    heavy, light = Task("h", "heavy"), Task("l", "light")
    share.join(heavy)
    share.join(light)
    for _ in range(20):
        share.start(heavy)
        share.end(heavy, 800)  # 16000 served; light nothing (training, say)
    assert share.start(light) == 16000 - 2 * 800  # ahead, by two batches at most
    assert share.start(heavy) == 16000


def test_a_dropped_rollout_is_charged_its_estimate():
    share = RolloutShare()
    t = Task("a", "a")
    share.join(t)
    share.start(t)
    share.end(t, 300)
    share.start(t)
    share.end(t)  # failed: the server did the work
    assert share.vtokens["a"] == 600
    share.end(t)  # nothing in flight: ignored
    assert share.vtokens["a"] == 600


def rollouts(actions) -> list[StartRollout]:
    return [a for a in actions if isinstance(a, StartRollout)]


def test_the_core_gives_fair_priorities_and_charges_the_tokens_that_came_back():
    core = SchedulerCore(rollout_order="fair")
    (h,) = rollouts(core.handle(Submitted("h", 10, tenant="heavy")))
    (light,) = rollouts(core.handle(Submitted("l", 10, tenant="light")))
    assert (h.priority, light.priority) == (0, 0)
    core.handle(RolloutDone("h", 0, tokens=800))
    core.handle(RolloutDone("l", 0, tokens=100))
    assert core.rollout_share is not None
    assert core.rollout_share.vtokens == {"heavy": 800, "light": 100}


def test_fifo_rollouts_are_all_at_priority_0():
    core = SchedulerCore()
    assert core.rollout_share is None
    (a,) = rollouts(core.handle(Submitted("a", 10, tenant="x")))
    assert a.priority == 0
    core.handle(RolloutDone("a", 0, tokens=800))


def test_the_priority_goes_on_the_wire_only_when_set(monkeypatch):
    from areal.api.cli_args import GenerationHyperparameters
    from areal.api.io_struct import ModelRequest

    backend = MultiLoRAVLLMBackend()
    req = ModelRequest(
        input_ids=[1, 2, 3], gconfig=GenerationHyperparameters(lora_name="a")
    )
    assert "priority" not in backend.build_generation_request(req, True, 0).payload
    token = engine_module._PRIORITY.set(7)
    try:
        payload = backend.build_generation_request(req, True, 0).payload
    finally:
        engine_module._PRIORITY.reset(token)
    assert payload["priority"] == 7
