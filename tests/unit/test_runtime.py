"""The runtime's own loop: events, KV polling, failure reasons and the version
the trainer reports. The rollout and trainer here are in-memory stand-ins: these
tests provoke loop faults (thousands of unreadable KV probes, a trainer that
reports the wrong version) that the real engines cannot be made to show."""

from __future__ import annotations

import threading
import time

import pytest

from areal_marlaas.rundir.reader import read_jsonl
from areal_marlaas.scheduler.backends import RolloutBackend, TrainBackend
from areal_marlaas.scheduler.runtime import Runtime, RuntimeOptions
from areal_marlaas.train.pool import TrainerPool
from tests.support.runtime_fakes import Rollout, Trainer, store, task


def test_the_stand_ins_have_all_the_runtime_calls():
    assert isinstance(Rollout(), RolloutBackend)
    assert isinstance(Trainer(), TrainBackend)


def test_dispatcher_survives_5000_unreadable_kv_probes(tmp_path):
    polls = 0
    enough = threading.Event()

    def unreadable():
        nonlocal polls
        polls += 1
        if polls >= 5000:
            enough.set()
        return None

    options = RuntimeOptions(kv_probe=unreadable, kv_poll_interval_s=1e-6)
    runtime = Runtime([task("a")], Rollout(gate=enough), Trainer(), store(tmp_path))
    runtime.options = options

    summary = runtime.run()

    assert polls >= 5000
    assert summary["tasks"]["a"]["status"] == "done"


def test_failure_reason_of_every_episode_reaches_the_summary(tmp_path):
    rollout = Rollout(fail="RewardError: task 'a': reward_fn raised ValueError: x")
    runtime = Runtime([task("a")], rollout, Trainer(), store(tmp_path))

    summary = runtime.run()

    err = summary["tasks"]["a"]["error"]
    assert summary["tasks"]["a"]["status"] == "failed"
    assert "all 2 rollouts of v0 failed" in err
    assert "reward_fn raised ValueError: x" in err


def test_a_step_reports_the_groups_it_discarded(tmp_path):
    s = store(tmp_path)
    Runtime([task("a", steps=2)], Rollout(discard=1), Trainer(), s).run()

    steps = read_jsonl(s.steps_path)
    assert [r["discarded_groups"] for r in steps] == [1, 1]
    assert [r["n_trajectories"] for r in steps] == [1, 1]  # trained on the rest


def test_the_trainers_version_is_the_one_committed(tmp_path):
    s = store(tmp_path)
    Runtime([task("a", steps=2)], Rollout(), Trainer(), s).run()

    assert s.committed("a")["version"] == 2
    assert [r["version"] for r in read_jsonl(s.steps_path)] == [1, 2]
    # The stand-in's trajectories carry a tool interval: an env phase per step.
    env = [e for e in read_jsonl(s.events_path) if e.get("phase") == "env"]
    assert [(e["start"], e["end"]) for e in env] == [(10.0, 11.5)] * 2 * 2


def test_a_trainer_that_commits_another_version_fails_the_task(tmp_path):
    s = store(tmp_path)
    summary = Runtime([task("a")], Rollout(), Trainer(skew=1), s).run()

    assert summary["tasks"]["a"]["status"] == "failed"
    assert "committed v2 for a batch of v0" in summary["tasks"]["a"]["error"]
    assert s.committed("a")["version"] == 0


@pytest.mark.parametrize("mode", ["async", "sync", "sequential"])
def test_every_mode_runs_two_tasks_to_the_end(tmp_path, mode):
    s = store(tmp_path)
    runtime = Runtime(
        [task("a", 2), task("b", 2)],
        Rollout(),
        Trainer(),
        s,
        RuntimeOptions(mode=mode),
    )

    summary = runtime.run()

    assert {t["status"] for t in summary["tasks"].values()} == {"done"}
    assert s.committed("a")["version"] == s.committed("b")["version"] == 2


class Worker(Trainer):
    def __init__(self):
        super().__init__()
        self.tasks: set[str] = set()

    def add_task(self, name, **kwargs):
        self.tasks.add(name)

    def remove_task(self, name):
        self.tasks.discard(name)


class Releasing(Rollout):
    def __init__(self):
        super().__init__()
        self.removed: list[str] = []

    def remove_task(self, name):
        self.removed.append(name)


def test_a_task_refused_by_admission_in_the_service_frees_its_trainer_and_adapter(
    tmp_path,
):
    # The service adds a job's task to its trainer worker before the core sees
    # it; a refusal must not leave its weights, optimizer and placement behind.
    pool = TrainerPool([Worker(), Worker()])
    rollout = Releasing()
    refused: list[tuple[str, str]] = []
    options = RuntimeOptions(
        kv_budget=100,
        release_finished=True,
        on_status=lambda name, status, why: refused.append((name, status)),
    )
    runtime = Runtime([], rollout, pool, store(tmp_path), options)
    big = task("big")
    big.kv_bytes = 1_000
    pool.add_task("big")
    assert pool.trainer_of("big") == 0
    stop = threading.Event()
    serving = threading.Thread(target=runtime.serve, args=(stop,))
    serving.start()
    runtime.add(big)
    deadline = time.monotonic() + 10
    while "big" not in rollout.removed and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    serving.join(10)

    assert refused == [("big", "failed")]
    assert "could never be admitted" in runtime.rejected["big"]
    assert rollout.removed == ["big"]
    assert pool.trainer_of("big") is None
    assert pool.engines[0].tasks == set()


class EvalsWaitForAStep(Rollout):
    """Eval batches (group size 1) return only once ``stepped`` is set (at most
    30 s); training batches are quick."""

    def __init__(self, stepped: threading.Event):
        super().__init__()
        self.stepped = stepped

    def rollout_task(self, rows, workflow, kwargs=None, group_size=1, timeout=None):
        # Versions are pinned when requests are made, as the real engine does.
        out = super().rollout_task(rows, workflow, kwargs, group_size, timeout)
        if group_size == 1:
            self.stepped.wait(30)
        return out


class SignalsVersion(Trainer):
    """Sets ``stepped`` once a step commits ``version``."""

    def __init__(self, version: int, stepped: threading.Event):
        super().__init__()
        self.target, self.stepped = version, stepped

    def train_task(self, task, batch):
        out = super().train_task(task, batch)
        if out["version"] == self.target:
            self.stepped.set()
        return out


def test_evals_run_beside_the_next_rollout_and_land_in_the_run_directory(tmp_path):
    s = store(tmp_path)
    t = task("a", 3)
    t.eval_rows, t.eval_every = t.data.rows[:3], 2
    seen: list[tuple[int, float | None]] = []
    options = RuntimeOptions(
        on_eval=lambda r, _: seen.append((r["version"], r["reward_mean"]))
    )
    # The eval of v2 ends only once the v2 -> v3 step is done: a runtime that
    # waited for the eval before that rollout would keep it waiting 30 s.
    stepped = threading.Event()
    rollout, trainer = EvalsWaitForAStep(stepped), SignalsVersion(3, stepped)
    summary = Runtime([t], rollout, trainer, s, options).run()

    assert summary["tasks"]["a"]["status"] == "done"
    assert summary["tasks"]["a"]["eval_last"] == (3, 1.0)
    evals = read_jsonl(s.evals_path)
    assert [(e["version"], e["samples"], e["failed"]) for e in evals] == [
        (2, 3, 0),
        (3, 3, 0),
    ]
    assert sorted(seen) == [(2, 1.0), (3, 1.0)]
    # Generated by the version it evaluates, and every row's sample is kept.
    assert [e["versions"] for e in evals] == [[2], [3]]
    assert len(s.eval_samples("a", 2)) == 3
    # The eval of v2 ran beside the rollout and step of v2 -> v3.
    phases = {
        (e["phase"], e["version"]): e for e in read_jsonl(s.events_path) if "phase" in e
    }
    ev, nxt = phases[("eval", 2)], phases[("rollout", 2)]
    assert nxt["start"] < ev["end"]
    assert phases[("train", 2)]["start"] < ev["end"]


def test_an_eval_that_raises_is_recorded_and_the_task_still_finishes(tmp_path):
    class Broken(Rollout):
        def rollout_task(self, rows, workflow, kwargs=None, group_size=1, timeout=None):
            if group_size == 1:
                raise ConnectionError("server gone")
            return super().rollout_task(rows, workflow, kwargs, group_size, timeout)

    s = store(tmp_path)
    t = task("a", 1)
    t.eval_rows, t.eval_every = t.data.rows[:2], 1
    summary = Runtime([t], Broken(), Trainer(), s).run()

    assert summary["tasks"]["a"]["status"] == "done"
    (e,) = read_jsonl(s.evals_path)
    assert e["reward_mean"] is None and "server gone" in e["error"]


def test_a_task_added_twice_is_ignored_and_the_loop_keeps_serving(tmp_path):
    done: list[tuple[str, str]] = []
    options = RuntimeOptions(on_status=lambda n, s, why: done.append((n, s)))
    runtime = Runtime([], Rollout(), Trainer(), store(tmp_path), options)
    stop = threading.Event()
    serving = threading.Thread(target=runtime.serve, args=(stop,))
    serving.start()
    first = task("a", steps=2)
    runtime.add(first)
    runtime.add(task("a", steps=2))  # the same name again
    runtime.add(task("b"))
    deadline = time.monotonic() + 10
    while ("b", "done") not in done and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    serving.join(10)
    assert not serving.is_alive()
    assert ("a", "done") in done and ("b", "done") in done
    assert runtime.tasks["a"] is first  # the running one was kept


def test_each_rollout_is_sent_at_the_priority_the_core_gave_it(tmp_path):
    from areal_marlaas.scheduler.core import RolloutOrder

    rollout = Rollout()
    options = RuntimeOptions(rollout_order=RolloutOrder.FAIR)
    a, b = task("a", steps=3), task("b", steps=3)
    a.tenant, b.tenant = "x", "y"
    runtime = Runtime([a, b], rollout, Trainer(), store(tmp_path), options)
    runtime.run()
    share = runtime.core.rollout_share
    assert share is not None
    # A stand-in batch is 2 episodes of 2 generated tokens: every rollout is
    # charged what came back.
    assert share.vtokens == {"x": 3 * 4, "y": 3 * 4}
    sent = [p for _, p in rollout.priorities]
    assert len(sent) == 6 and sent[:2] == [0, 0] and max(sent) >= 4
