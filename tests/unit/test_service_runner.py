"""The service runner's poller against the runtime's callbacks, on the real
SQLite job store: a job that ends while the poller looks at the store is never
handed to the scheduler again (a second add of a running task's name once
stopped the whole scheduler). The two threads' interleavings are forced here by
running one side inside the other's store call."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from areal_marlaas.config.service import ServiceConfig
from areal_marlaas.scheduler.backends import TaskStatus
from areal_marlaas.scheduler.core import (
    PublishDone,
    RolloutDone,
    SchedulerCore,
    Submitted,
    TrainDone,
)
from areal_marlaas.service.recorder import Admitted
from areal_marlaas.service.runner import ServiceRunner
from areal_marlaas.service.store import JobStore
from areal_marlaas.service.tables import Job
from tests.support.jobs import new_tenant, running_job


@pytest.fixture
def store(tmp_path) -> Iterator[JobStore]:
    st = JobStore(f"sqlite:///{tmp_path / 'service.db'}", tmp_path)
    yield st
    st.close()


def runner_holding(store: JobStore, tmp_path, job: Job) -> ServiceRunner:
    """A runner whose runtime holds ``job`` (no trainer or server: only the
    poller's and the callbacks' bookkeeping run)."""
    runner = ServiceRunner.__new__(ServiceRunner)
    runner.jobs = store
    runner.svc = ServiceConfig(root=str(tmp_path))
    runner.stop = threading.Event()
    runner._lock = threading.Lock()
    runner.recorder = SimpleNamespace(flush=lambda held: None)  # type: ignore[assignment]
    runner.admitted = {
        job.task_name: Admitted(job.id, job.tenant_id, job.task_name, 2, started=True)
    }
    runner.handed: list[str] = []  # type: ignore[attr-defined]
    runner._hand_over = lambda j: runner.handed.append(j.id)  # type: ignore[method-assign,attr-defined]
    return runner


@pytest.mark.parametrize("status", [TaskStatus.CANCELLED, TaskStatus.FAILED])
def test_a_job_ending_during_the_store_query_is_not_handed_over(
    store, tmp_path, monkeypatch, status
):
    job = running_job(store, new_tenant(store, "acme"))
    runner = runner_holding(store, tmp_path, job)
    query = store.jobs_with_status

    def racing(wanted):
        rows = query(wanted)  # still lists the job as running...
        if wanted == "running":  # ...then the runtime ends it
            runner._on_status(job.task_name, status, "boom")
        return rows

    monkeypatch.setattr(store, "jobs_with_status", racing)
    runner._admit()
    assert runner.handed == []  # type: ignore[attr-defined]
    assert store.job(job.id).status == status.value
    assert runner.admitted == {}


@pytest.mark.parametrize("status", [TaskStatus.CANCELLED, TaskStatus.FAILED])
def test_a_poll_while_a_job_ends_does_not_hand_it_over(
    store, tmp_path, monkeypatch, status
):
    job = running_job(store, new_tenant(store, "acme"))
    runner = runner_holding(store, tmp_path, job)
    write = store.set_status

    def polled_first(job_id, new, *args, **kwargs):
        runner._admit()  # the poller runs just before the status is written
        return write(job_id, new, *args, **kwargs)

    monkeypatch.setattr(store, "set_status", polled_first)
    runner._on_status(job.task_name, status, "boom")
    assert runner.handed == []  # type: ignore[attr-defined]
    assert store.job(job.id).status == status.value


def adaptive_runner(
    store: JobStore, tmp_path, n: int
) -> tuple[ServiceRunner, SchedulerCore, str, list[Job]]:
    """A runner holding ``n`` jobs of one tenant on an adaptive core (4 steps
    each): the first two roll out, the others are held ``load``."""
    tenant = new_tenant(store, "acme")
    jobs = [running_job(store, tenant) for _ in range(n)]
    runner = runner_holding(store, tmp_path, jobs[0])
    core = SchedulerCore(concurrency="adaptive")
    runner.runtime = SimpleNamespace(core=core)  # type: ignore[assignment]
    for i, job in enumerate(jobs):
        runner.admitted[job.task_name] = Admitted(
            job.id, tenant, job.task_name, 4, started=i < 2
        )
        core.handle(Submitted(job.task_name, 4))
    return runner, core, tenant, jobs


def test_a_job_waiting_for_room_in_the_loop_gets_its_position_and_start(
    store, tmp_path
):
    """concurrency=adaptive: two jobs fill the loop (each counts as half the
    trainer before anything is measured), the next two are held ``load``; the
    first held one's event gives position 1 of 2 and, as its start, the sooner
    of the running jobs' estimated finishes."""
    runner, _, tenant, jobs = adaptive_runner(store, tmp_path, 4)
    runner.admitted[jobs[0].task_name].eta = 2_000_000_000.0
    runner.admitted[jobs[1].task_name].eta = 1_900_000_000.0

    runner._on_status(jobs[2].task_name, TaskStatus.HELD, "load")

    event = store.list_events(tenant, jobs[2].id).items[0]  # the newest
    assert event.message.startswith("Queued: position 1 of 2; the 2 running job(s)")
    assert event.data == {
        "queue_position": 1,
        "queue_length": 2,
        "running": 2,
        "estimated_start": 1_900_000_000.0,
    }


def test_a_running_job_without_two_commits_is_timed_by_its_measured_cycle(
    store, tmp_path, monkeypatch
):
    """Before a job has the two commits its ETA needs, its steps left x its
    measured cycle (rollout + publish + step) stand in."""
    monkeypatch.setattr("areal_marlaas.service.runner.time.time", lambda: 1000.0)
    runner, core, tenant, jobs = adaptive_runner(store, tmp_path, 3)
    a, b = jobs[0].task_name, jobs[1].task_name
    core.handle(RolloutDone(a, 0, rollout_s=20.0))
    core.handle(RolloutDone(b, 0, rollout_s=20.0))
    core.handle(TrainDone(a, 1, train_s=10.0))
    core.handle(PublishDone(a, 1, publish_s=0.0))  # a: 3 steps left of 30 s

    runner._on_status(jobs[2].task_name, TaskStatus.HELD, "load")

    event = store.list_events(tenant, jobs[2].id).items[0]
    assert event.data["estimated_start"] == 1000.0 + 3 * 30.0
