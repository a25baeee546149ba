"""Fault tolerance without a model: run-directory reconcile, retention and path
guards, the reaper (no orphans), the server supervisor on a stand-in server, and
isolated reward functions."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from areal_marlaas.config import FaultToleranceConfig
from areal_marlaas.errors import ConfigError
from areal_marlaas.rollout import reaper
from areal_marlaas.rollout.server import (
    RolloutServerConfig,
    VLLMServer,
    free_port,
    with_reaper,
)
from areal_marlaas.rollout.supervisor import (
    ServerRestartedError,
    ServerSupervisor,
    SupervisedRollout,
)
from areal_marlaas.rundir.reader import read_jsonl
from areal_marlaas.rundir.writer import RunStore
from areal_marlaas.workflows.reward import (
    IsolatedReward,
    RewardError,
    RewardTimeoutError,
)
from tests.support.procs import alive, wait_for
from tests.support.rewards import (
    good_reward,
    hanging_reward,
    raising_reward,
    text_reward,
)
from tests.support.runtime_fakes import FakeBackend


def fake_adapter(store: RunStore, task: str, version: int) -> None:
    d = store.adapter_dir(task, version)
    d.mkdir(parents=True)
    (d / "adapter_model.safetensors").write_bytes(b"x")


def commit(store: RunStore, task: str, version: int) -> None:
    fake_adapter(store, task, version)
    store.commit(task, version, {"cursor": version})


# -- run directory ---------------------------------------------------------------
def test_resumed_store_drops_uncommitted_and_half_written_lines(tmp_path):
    store = RunStore(tmp_path)
    for v in (0, 1, 2):
        commit(store, "a", v)
    commit(store, "b", 0)
    for task, v in [("a", 1), ("b", 1), ("a", 2), ("a", 3)]:
        store.step({"task": task, "version": v})
    store.step({"task": "a", "version": 2})  # a duplicate of a committed step
    store.event("a", 2, "train", 0.0, 1.0)  # trained v2 -> v3, never committed
    store.event("a", 2, "rollout", 0.0, 1.0)
    with open(store.steps_path, "a") as f:
        f.write('{"task": "b", "vers')  # the crash cut this line

    resumed = RunStore(tmp_path, fresh=False)

    steps = read_jsonl(resumed.steps_path)
    assert [(s["task"], s["version"]) for s in steps] == [("a", 1), ("a", 2)]
    events = read_jsonl(resumed.events_path)
    assert [(e["phase"], e["version"]) for e in events] == [("rollout", 2)]
    assert resumed.steps_path.read_text().endswith("\n")
    assert resumed.committed("a")["version"] == 2  # commits untouched
    # Resuming again changes nothing.
    assert RunStore(tmp_path, fresh=False).reconcile() == {
        "steps.jsonl": 0,
        "events.jsonl": 0,
    }


def test_damaged_line_before_the_end_is_an_error(tmp_path):
    store = RunStore(tmp_path)
    commit(store, "a", 1)
    store.steps_path.write_text('{"task": "a", "version": 1}\nnot json\n{"x": 1}\n')

    with pytest.raises(ValueError, match="steps.jsonl:2 is not JSON"):
        RunStore(tmp_path, fresh=False)


@pytest.mark.parametrize("name", ["../evil", "a/../../b", "..", "", "/etc"])
def test_task_dir_outside_the_run_directory_is_refused(tmp_path, name):
    store = RunStore(tmp_path / "run")

    with pytest.raises(ValueError, match="escapes the run directory"):
        store.task_dir(name)


def test_retention_keeps_last_k_and_the_served_version(tmp_path):
    store = RunStore(tmp_path)
    for v in range(6):
        commit(store, "a", v)
    fake_adapter(store, "a", 6)  # written, not yet committed (being published)

    store.retain_adapters("a", keep_last=2, served=1)

    kept = sorted(int(d.name[1:]) for d in (store.task_dir("a") / "adapters").iterdir())
    assert kept == [1, 4, 5, 6]
    store.retain_adapters("a", keep_last=0, served=5)  # 0 = keep all
    assert len(list((store.task_dir("a") / "adapters").iterdir())) == 4


def test_fault_config_rejects_bad_values():
    with pytest.raises(ConfigError, match="fault.keep_adapters must be >= 0"):
        FaultToleranceConfig(keep_adapters=-1)
    with pytest.raises(ConfigError, match="fault.save_retries must be >= 0"):
        FaultToleranceConfig(save_retries=-1)
    with pytest.raises(ConfigError, match="fault.health_timeout_s must be > 0"):
        FaultToleranceConfig(health_timeout_s=0)


# -- no orphans ------------------------------------------------------------------
# A stand-in server: forks a worker (like vLLM's EngineCore), both sleep forever.
SERVER_WITH_WORKER = textwrap.dedent(
    """
    import os, sys, time
    pid = os.fork()
    with open(sys.argv[1], "a") as f:
        f.write(f"{os.getpid()}\\n")
    time.sleep(600)
    """
)

# A launcher (the "trainer"): starts the stand-in under the reaper, then waits.
LAUNCHER = textwrap.dedent(
    """
    import subprocess, sys, time
    argv = [sys.executable, sys.argv[1], sys.executable, "-c", sys.argv[2], sys.argv[3]]
    subprocess.Popen(argv, start_new_session=True)
    time.sleep(600)
    """
)


def test_sigkilled_launcher_leaves_no_server_or_worker(tmp_path):
    pids = tmp_path / "pids"
    launcher = subprocess.Popen(
        [
            sys.executable,
            "-c",
            LAUNCHER,
            reaper.__file__,
            SERVER_WITH_WORKER,
            str(pids),
        ]
    )
    wait_for(lambda: pids.exists() and len(pids.read_text().split()) == 2, 30)
    server_pids = [int(p) for p in pids.read_text().split()]
    assert all(alive(p) for p in server_pids)

    launcher.send_signal(signal.SIGKILL)
    launcher.wait()

    gone_s = wait_for(lambda: not any(alive(p) for p in server_pids), 20)
    print(f"server and worker gone {gone_s:.2f}s after SIGKILL of the launcher")


def test_with_reaper_keeps_the_server_command():
    argv = ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--x"]

    wrapped = with_reaper(argv)

    assert wrapped[0] == argv[0] and wrapped[2:] == argv
    assert wrapped[1].endswith("rollout/reaper.py") and Path(wrapped[1]).is_file()


# -- supervisor --------------------------------------------------------------------
class StandInServer(VLLMServer):
    """``python -m http.server`` with a ``health`` file: GET /health is 200."""

    def __init__(self, root: Path):
        (root / "www").mkdir(exist_ok=True)
        (root / "www" / "health").write_text("ok")
        self.www = root / "www"
        cfg = RolloutServerConfig(port=free_port(), startup_timeout_s=30)
        super().__init__("stand-in", None, cfg, root / "server.log")

    def command(self):
        argv = [sys.executable, "-m", "http.server", str(self.port)]
        argv += ["--bind", "127.0.0.1", "--directory", str(self.www)]
        return argv, {}

    def child_pids(self) -> list[int]:
        """The server itself (the reaper's child), not the reaper."""
        pgid = self.process.pid
        return [p for p in reaper.group_members(pgid) if p != pgid]


# Checks every 0.2 s; a dead server is caught by its exit (the reaper's own
# exit, ~0.2-0.5 s after the server's), long before 25 refused /health calls
# (5 s) would call it hung; a local /health answers in ms, 5 s is its limit.
FAST = FaultToleranceConfig(
    health_interval_s=0.2, health_timeout_s=5.0, health_failures=25, restart_limit=2
)
# A stopped server never answers: two /health calls past 0.5 s are a hang.
HANG = FaultToleranceConfig(
    health_interval_s=0.2, health_timeout_s=0.5, health_failures=2, restart_limit=2
)


@pytest.fixture
def supervised(tmp_path, request):
    """A supervised stand-in server (``FAST``, or the config a test passes by
    ``@pytest.mark.parametrize("supervised", [cfg], indirect=True)``)."""
    server = StandInServer(tmp_path)
    server.start()
    backend = FakeBackend()
    sup = ServerSupervisor(server, getattr(request, "param", FAST))
    rollout = SupervisedRollout(backend, sup)
    rollout.register_task("a", 0, "/x/a/v0")
    rollout.publish("a", 1, "/x/a/v1")
    rollout.register_task("b", 3, "/x/b/v3")
    sup.start()
    yield server, sup, rollout, backend
    sup.stop()
    server.stop()


def test_supervisor_restarts_a_dead_server_and_reloads_current_adapters(supervised):
    server, sup, rollout, backend = supervised
    port = server.port
    backend.loaded.clear()

    os.kill(server.child_pids()[0], signal.SIGKILL)  # the server crashes
    wait_for(lambda: sup.generation == 1 and sup.ready(), 30)

    r = sup.restarts[0]
    assert r.ok and "exited" in r.reason and r.adapters == 2
    assert server.port == port and server.alive()
    assert sorted(backend.loaded) == [("a", 1, "/x/a/v1"), ("b", 3, "/x/b/v3")]
    print(f"death: detected in {r.detect_s:.2f}s, recovered in {r.recovery_s:.2f}s")


@pytest.mark.parametrize("supervised", [HANG], indirect=True)
def test_supervisor_restarts_a_hung_server(supervised):
    server, sup, rollout, backend = supervised
    old = server.process.pid

    os.killpg(old, signal.SIGSTOP)  # hangs: alive, but /health never answers
    wait_for(lambda: sup.generation == 1 and sup.ready(), 30)

    r = sup.restarts[0]
    assert r.ok and "hung" in r.reason
    assert server.process.pid != old and not alive(old)
    print(f"hang: detected in {r.detect_s:.2f}s, recovered in {r.recovery_s:.2f}s")


def test_rollout_overlapping_a_restart_is_refused_for_retry(supervised):
    server, sup, rollout, backend = supervised

    def slow_rollout(rows, *args, **kwargs):
        os.kill(server.child_pids()[0], signal.SIGKILL)
        wait_for(lambda: sup.generation == 1, 30)
        return [None for _ in rows]

    backend.rollout_task = slow_rollout
    with pytest.raises(ServerRestartedError, match="same version"):
        rollout.rollout_task([1, 2])
    backend.rollout_task = FakeBackend.rollout_task.__get__(backend)
    assert rollout.rollout_task([1]) == [{"row": 1}]  # the retry goes through


def test_publish_cut_by_a_server_death_goes_through_after_the_restart(supervised):
    server, sup, rollout, backend = supervised
    calls = []

    def publish(task, version, path):
        calls.append(version)
        if len(calls) == 1:  # the server dies under the first try
            pid = server.child_pids()[0]
            os.kill(pid, signal.SIGKILL)
            wait_for(lambda: not alive(pid), 10)
            raise ConnectionError("worker died")
        backend.register_task(task, version, path)

    backend.publish = publish
    rollout.publish("a", 2, "/x/a/v2")
    assert calls == [2, 2] and sup.generation == 1
    assert backend.served()["a"] == (2, "/x/a/v2")


def test_publish_failing_on_a_healthy_server_raises_its_error(supervised):
    server, sup, rollout, backend = supervised

    def publish(task, version, path):
        raise FileNotFoundError(path)

    backend.publish = publish
    with pytest.raises(FileNotFoundError, match="v2"):
        rollout.publish("a", 2, "/x/a/v2")
    assert sup.generation == 0


def test_supervisor_gives_up_after_the_restart_limit(tmp_path):
    server = StandInServer(tmp_path)
    server.start()
    sup = ServerSupervisor(
        server,
        FaultToleranceConfig(
            health_interval_s=0.2, health_timeout_s=0.5, restart_limit=0
        ),
    ).start()
    try:
        os.kill(server.child_pids()[0], signal.SIGKILL)
        wait_for(lambda: sup.failed, 30)
        with pytest.raises(RuntimeError, match="restart_limit"):
            sup.wait_ready(1)
    finally:
        sup.stop()
        server.stop()


# -- rewards -----------------------------------------------------------------------
def run(coro):
    return asyncio.run(coro)


_TRAINER_STATE: dict[str, bytearray | None] = {"weights": None}


def sees_the_trainers_memory(*args, **kwargs):
    return 1.0 if _TRAINER_STATE["weights"] is not None else 0.0


# A "trainer" with a reward pool's workers up: prints their pids and its fork
# server's, then waits to be killed.
REWARD_TRAINER = textwrap.dedent(
    """
    import os, time
    from multiprocessing import forkserver
    from areal_marlaas.workflows.reward import IsolatedReward
    pool = IsolatedReward("t", len, timeout_s=30, workers=2)._pool()
    workers = {pool.submit(os.getpid).result() for _ in range(8)}
    print("PIDS", forkserver._forkserver._forkserver_pid, *workers, flush=True)
    time.sleep(600)
    """
)


def test_a_sigkilled_trainers_reward_workers_and_fork_server_end():
    trainer = subprocess.Popen(
        [sys.executable, "-c", REWARD_TRAINER], stdout=subprocess.PIPE, text=True
    )
    try:
        assert trainer.stdout is not None
        line = next(x for x in trainer.stdout if x.startswith("PIDS"))
        pids = [int(p) for p in line.split()[1:]]
        assert len(pids) >= 2 and all(alive(p) for p in pids)
    finally:
        trainer.send_signal(signal.SIGKILL)
        trainer.wait()

    wait_for(lambda: not any(alive(p) for p in pids), 30)


def test_reward_workers_do_not_inherit_the_trainers_memory():
    """A forked worker would pin the trainer's pages as of the fork (three of a
    5 GB trainer ran the paper mix out of memory): workers start clean."""
    _TRAINER_STATE["weights"] = bytearray(64 * 2**20)  # state set after import
    try:
        reward = IsolatedReward("t_clean", sees_the_trainers_memory, timeout_s=60)
        assert run(reward("p", "c")) == 0.0
    finally:
        _TRAINER_STATE["weights"] = None
        IsolatedReward.shutdown_all()


_FIRST_REWARD = """
import asyncio, json, sys, time
from areal_marlaas.tasks.rewards import numeric_answer_reward_fn
from areal_marlaas.workflows.reward import IsolatedReward


async def main():
    if sys.argv[1] == "warm":
        IsolatedReward.warm().join()
    gaps, clock = [], {"last": time.monotonic(), "done": False}

    async def tick():  # another episode's work on the shared event loop
        while not clock["done"]:
            await asyncio.sleep(0.02)
            now = time.monotonic()
            gaps.append(now - clock["last"])
            clock["last"] = now

    ticker = asyncio.create_task(tick())
    t0 = time.monotonic()
    reward = IsolatedReward("t", numeric_answer_reward_fn, timeout_s=120)
    value = await reward("p", "The answer is 4", [], [], answer="4")
    took = time.monotonic() - t0
    clock["done"] = True
    await ticker
    IsolatedReward.shutdown_all()
    print(json.dumps({"reward": value, "took_s": took, "max_gap_s": max(gaps)}))


if __name__ == "__main__":
    asyncio.run(main())
"""


def test_first_reward_neither_blocks_the_event_loop_nor_waits_once_warm(tmp_path):
    """A fresh process's first reward waits for the fork server's imports
    (seconds): the event loop every episode shares keeps running meanwhile, and
    after ``warm`` (the rollout engine calls it at start) it does not wait."""
    script = tmp_path / "first_reward.py"
    script.write_text(_FIRST_REWARD)

    def first_reward(how: str) -> dict:
        out = subprocess.run(
            [sys.executable, str(script), how],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    cold, warm = first_reward("cold"), first_reward("warm")
    assert cold["reward"] == warm["reward"] == 1.0
    # The loop ticked all through the cold wait for the imports (~5 s wait,
    # ~0.03 s gaps here): a blocked loop's one gap would be the whole wait.
    # Relative to the wait, so a faster or slower machine reads the same.
    assert cold["max_gap_s"] < cold["took_s"] / 4, cold
    # Warm, the first reward waits for no import: 0.04 s here, 25x below.
    assert warm["took_s"] < 1.0, warm


def test_the_multi_task_engine_warms_rewards_and_areals_trainers_do_not(monkeypatch):
    """Our runtime's rollout engine starts the fork server when it initializes;
    the engine AReaL's own trainers use (the replicated-AReaL baseline) does
    not: they score with AReaL's reward wrapper, and a fork server holds ~1 GB."""
    from areal.engine.vllm_remote import RemotevLLMEngine

    from areal_marlaas.rollout.engine import MultiLoRAvLLMEngine, SingleTaskvLLMEngine

    calls = []
    monkeypatch.setattr(
        IsolatedReward, "warm", classmethod(lambda cls: calls.append("warm"))
    )
    monkeypatch.setattr(
        RemotevLLMEngine, "initialize", lambda self, *a, **k: calls.append("init")
    )
    for cls in (MultiLoRAvLLMEngine, SingleTaskvLLMEngine):
        cls.initialize(object.__new__(cls))
    assert calls == ["warm", "init", "init"]


def test_isolated_reward_raises_the_tenants_error():
    reward = IsolatedReward("t_raise", raising_reward, timeout_s=30)

    with pytest.raises(RewardError, match="reward_fn raised ValueError: tenant bug"):
        run(reward("p", "c"))
    with pytest.raises(RewardError, match="returned 'high', not a number"):
        run(IsolatedReward("t_text", text_reward, timeout_s=30)("p", "c"))


def test_hanging_reward_times_out_kills_its_worker_and_spares_others(monkeypatch):
    other = IsolatedReward("t_other", good_reward, timeout_s=30)
    assert run(other("p", "42")) == 1.0
    hung = IsolatedReward("t_hang", hanging_reward, timeout_s=1.0)
    discarded: list[int] = []
    discard = IsolatedReward._discard.__func__

    def spy(cls, task, pool):  # the hung pool's workers, as it is discarded
        discarded.extend(p.pid for p in (pool._processes or {}).values())
        discard(cls, task, pool)

    monkeypatch.setattr(IsolatedReward, "_discard", classmethod(spy))

    t0 = time.monotonic()
    with pytest.raises(RewardTimeoutError, match="within 1s"):
        run(hung("p", "c"))
    took = time.monotonic() - t0

    # Cut at the 1 s timeout (~1.0 s here), not after the reward's 600 s.
    assert took < 30
    assert discarded, "the hung pool was not discarded"
    wait_for(lambda: not any(alive(p) for p in discarded), 30)
    assert run(other("p", "41")) == 0.0  # another tenant's pool is untouched
    IsolatedReward.shutdown_all()
