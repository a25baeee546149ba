"""Elastic placement: the in-process trainer borrows the rollout cores while no
rollout is in flight, gives them back within one layer when one starts, and each
step reports what it used; the runtime's in-flight count drives it."""

from __future__ import annotations

import contextlib
import os

import pytest
import torch

from areal_marlaas.bench.plan import plan_runs
from areal_marlaas.config import ConfigError
from areal_marlaas.config.scheduler import MARLaaSSchedulerConfig
from areal_marlaas.rundir.reader import read_jsonl
from areal_marlaas.scheduler.runtime import Runtime
from areal_marlaas.train.elastic import ElasticCores, ElasticTrainBackend
from tests.support.bench import BENCH_YAML
from tests.support.runtime_fakes import Rollout, Trainer, store, task

needs_two = pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores to borrow one"
)


class Net(torch.nn.Module):
    def __init__(self, layers: int = 6):
        super().__init__()
        self.layers = torch.nn.ModuleList(
            torch.nn.Linear(16, 16) for _ in range(layers)
        )

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


@pytest.fixture
def restore_placement():
    cpus, threads = os.sched_getaffinity(0), torch.get_num_threads()
    yield
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(tid), cpus)
    torch.set_num_threads(threads)


def seen_by_layers(net: Net, backward: bool = False) -> list[tuple[int, set[int]]]:
    """(torch threads, this thread's cores) at every layer, forward then backward."""
    seen: list[tuple[int, set[int]]] = []

    def look(*_):
        seen.append((torch.get_num_threads(), os.sched_getaffinity(0)))

    hooks = [m.register_forward_pre_hook(look) for m in net.layers]
    out = net(torch.randn(4, 16, requires_grad=True))
    if backward:
        hooks += [m.register_full_backward_hook(look) for m in net.layers]
        out.sum().backward()
    for h in hooks:
        h.remove()
    return seen


@needs_two
def test_idle_server_lends_its_core_and_the_step_reports_it(restore_placement):
    own, borrow = {1}, {0}
    os.sched_setaffinity(0, own)
    torch.set_num_threads(1)
    net = Net()
    cores = ElasticCores(own, borrow, busy=lambda: False)
    assert cores.install(net) == 6
    cores.step_begin()
    seen = seen_by_layers(net)
    used = cores.step_end()
    assert seen and all(s == (2, {0, 1}) for s in seen)
    assert used["cores_mean"] == pytest.approx(2.0, rel=0.01)
    assert used["borrowed_s"] > 0
    # Given back after the step: rollouts and rewards run in this process too.
    assert torch.get_num_threads() == 1 and os.sched_getaffinity(0) == own


@needs_two
def test_a_rollout_in_flight_keeps_the_trainer_on_its_own_cores(restore_placement):
    os.sched_setaffinity(0, {1})
    torch.set_num_threads(1)
    net = Net()
    cores = ElasticCores({1}, {0}, busy=lambda: True)
    cores.install(net)
    cores.step_begin()
    seen = seen_by_layers(net, backward=True)
    used = cores.step_end()
    assert all(s == (1, {1}) for s in seen)
    assert used == {"cores_mean": pytest.approx(1.0), "borrowed_s": 0.0}
    assert cores.switches == 0


@needs_two
def test_a_rollout_that_starts_mid_step_gets_its_core_back_at_the_next_layer(
    restore_placement,
):
    os.sched_setaffinity(0, {1})
    torch.set_num_threads(1)
    net = Net()
    calls = {"n": 0}

    def busy() -> bool:  # idle for the step start + 3 layers, then a rollout
        calls["n"] += 1
        return calls["n"] > 4

    cores = ElasticCores({1}, {0}, busy)
    cores.install(net)
    cores.step_begin()
    seen = seen_by_layers(net)
    used = cores.step_end()
    threads = [n for n, _ in seen]
    assert threads == [2, 2, 1, 1, 1, 1]
    assert 1.0 < used["cores_mean"] < 2.0


@needs_two
def test_backward_borrows_through_the_gradient_hooks(restore_placement):
    os.sched_setaffinity(0, {1})
    torch.set_num_threads(1)
    net = Net()
    state = {"busy": True}
    cores = ElasticCores({1}, {0}, lambda: state["busy"])
    cores.install(net)
    cores.step_begin()
    x = torch.randn(4, 16, requires_grad=True)
    out = net(x)
    assert torch.get_num_threads() == 1
    seen: list[int] = []
    x.register_hook(lambda g: seen.append(torch.get_num_threads()))
    state["busy"] = False  # the rollouts finished while the forward ran
    out.sum().backward()
    cores.step_end()
    assert seen == [2]  # the input's gradient came after a layer's hook


class Engine(Trainer):
    """The runtime test's trainer that also notes the rollouts in flight."""

    def __init__(self, runtime_ref):
        super().__init__()
        self.runtime_ref = runtime_ref
        self.seen: list[int] = []

    def train_task(self, task_name, batch, valid=None):
        self.seen.append(self.runtime_ref[0].rollouts_running)
        return super().train_task(task_name, batch, valid)


class CountingRollout(Rollout):
    def __init__(self, runtime_ref):
        super().__init__()
        self.runtime_ref = runtime_ref
        self.seen: list[int] = []

    def rollout_task(self, rows, workflow, kwargs=None, group_size=1, timeout=None):
        self.seen.append(self.runtime_ref[0].rollouts_running)
        return super().rollout_task(rows, workflow, kwargs, group_size, timeout)


def test_the_runtime_counts_rollouts_in_flight_and_steps_record_cores(tmp_path):
    ref: list[Runtime] = []
    rollout, engine = CountingRollout(ref), Engine(ref)
    cores = ElasticCores({0}, set(), busy=lambda: ref[0].rollouts_running > 0)
    runtime = Runtime(
        [task("a", 2)], rollout, ElasticTrainBackend(engine, cores), store(tmp_path)
    )
    ref.append(runtime)
    runtime.run()
    assert rollout.seen == [1, 1]  # its own rollout is in flight
    assert engine.seen == [0, 0]  # one task: nothing rolls out while it trains
    assert runtime.rollouts_running == 0
    steps = list(read_jsonl(runtime.store.root / "steps.jsonl"))
    assert [s["cores_mean"] for s in steps] == [1.0, 1.0]
    assert all(s["borrowed_s"] == 0.0 for s in steps)


def test_elastic_cpus_is_refused_where_it_cannot_work():
    with pytest.raises(ConfigError, match="needs scheduler.trainer_cpus"):
        MARLaaSSchedulerConfig(type=None, elastic_cpus="0")
    with pytest.raises(ConfigError, match="scheduler.type=null"):
        MARLaaSSchedulerConfig(type="local", trainer_cpus="1", elastic_cpus="0")
    with pytest.raises(ConfigError, match="overlaps"):
        MARLaaSSchedulerConfig(type=None, trainer_cpus="0-1", elastic_cpus="1")
    MARLaaSSchedulerConfig(type=None, trainer_cpus="1", elastic_cpus="0")


def test_the_elastic_ablation_borrows_the_benchs_server_cores(tmp_path):
    from areal_marlaas.bench.run import Bench, load_bench_config
    from areal_marlaas.config import load_config
    from areal_marlaas.config.bench import BenchRunConfig

    p = tmp_path / "bench.yaml"
    p.write_text(BENCH_YAML)
    bench, cfg, _, _ = load_bench_config(
        ["--config", str(p), "bench.ablations=[elastic]", "bench.server_cpus=0"]
    )
    plans = [x for x in plan_runs(bench, cfg) if x.label == "async_elastic"]
    assert plans and plans[0].mode == "async" and plans[0].scheduler == "null"
    runner = Bench.__new__(Bench)  # train_command needs only these
    runner.bench, runner.cfg, runner.base_yaml = bench, cfg, str(p)
    runner.train_overrides, runner.work = [], tmp_path
    cmd = runner.train_command(plans[0], "127.0.0.1:1", tmp_path / "t.yaml", "x")
    assert "scheduler.elastic_cpus='0'" in cmd
    assert "scheduler.trainer_cpus=1" in cmd
    # The train run's own config accepts what the bench passes.
    cfg2 = load_config(
        [
            "--config",
            str(p),
            "scheduler.type=null",
            "scheduler.trainer_cpus=1",
            "scheduler.elastic_cpus='0'",
        ],
        BenchRunConfig,
    )[0]
    assert cfg2.scheduler.elastic_cpus == "0"
