"""The job service stopped and started as operators do: ``marlaas service`` with
its defaults (its own vLLM server, trainer and rollout workers on AReaL's
LocalScheduler, a SQLite store) killed with SIGKILL to its process group
mid-run, started again (it resumes each job from its last commit), then stopped
by SIGINT to its whole process group (a terminal's Ctrl-C). Slow: ``make
test-live``."""

from __future__ import annotations

import signal
import sqlite3
import time

import pytest

from areal_marlaas.rundir.reader import read_jsonl
from tests.support.service_live import (
    BASE,
    STRING_CHECK,
    LiveService,
    lines,
    method,
    wait_all,
)

pytestmark = [pytest.mark.slow, pytest.mark.vllm]


def steps_of(client, jobs) -> dict[str, list[int]]:
    return {
        j.id: sorted(
            c.step_number
            for c in client.fine_tuning.jobs.checkpoints.list(j.id, limit=100).data
        )
        for j in jobs
    }


def assert_stopped_cleanly(live: LiveService, sig: int) -> None:
    """``sig`` to the group: exit code 0, no traceback, no process left behind,
    and the store closed (SQLite removes its write-ahead log when the last
    connection closes; a process that dies with it open leaves it)."""
    code, left = live.signal_group(sig)
    out = live.output()
    assert code == 0, out[-5000:]
    assert "Traceback" not in out, out[-5000:]
    assert left == [], (left, out[-3000:])
    assert not (live.root / "service.db-wal").exists(), out[-3000:]


def test_killed_then_stopped_service_resumes_every_job_from_its_last_commit(
    tmp_path,
):
    live = LiveService(
        tmp_path / "svc",
        [
            "service.max_new_tokens=16",
            "service.max_prompt_tokens=96",
            "service.poll_interval_s=0.3",
            "service.keep_checkpoints=0",  # every commit must survive the stops
        ],
    )
    a = live.add_tenant("acme")
    with live.running():
        f = a.files.create(file=("a.jsonl", lines(4, 3)), purpose="fine-tune")
        jobs = [
            a.fine_tuning.jobs.create(
                model=BASE,
                training_file=f.id,
                method=method(STRING_CHECK, n_epochs=2),
            )
            for _ in range(2)
        ]

        def committed() -> int:
            return sum(map(len, steps_of(a, jobs).values()))

        deadline = time.monotonic() + 900
        while committed() == 0:
            assert time.monotonic() < deadline, live.tail()
            time.sleep(0.5)
        killed_at = steps_of(a, jobs)
        assert sum(map(len, killed_at.values())) < 8  # mid-run
        # SIGKILL to the group: the workers (sessions of their own) and the vLLM
        # server go with the service, through their reapers.
        code, left = live.signal_group(signal.SIGKILL)
        assert code == -signal.SIGKILL and left == [], left

        # Restarted, it resumes every job from its last commit and finishes
        # them; then Ctrl-C (SIGINT to the group) stops it cleanly. (SIGTERM to
        # a group while a job runs: test_service_e2e.py's last test.)
        live.start()
        done = wait_all(a, [j.id for j in jobs], 1500)
        after = steps_of(a, jobs)
        assert_stopped_cleanly(live, signal.SIGINT)

    for j in jobs:
        job = done[j.id]
        assert job.status == "succeeded", (job, live.tail())
        # Nothing lost, nothing twice, and what was there before is still there.
        assert after[j.id] == list(range(1, job.steps_done + 1)) == [1, 2, 3, 4]
        assert set(killed_at[j.id]) <= set(after[j.id])
    db = sqlite3.connect(live.root / "service.db")
    assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert db.execute("PRAGMA foreign_key_check").fetchall() == []
    # The run store's step log: each job's versions once each, contiguous.
    logged: dict[str, list[int]] = {}
    for r in read_jsonl(live.run_dir / "steps.jsonl"):
        logged.setdefault(r["task"], []).append(r["version"])
    assert sorted(logged.values()) == [[1, 2, 3, 4], [1, 2, 3, 4]], logged
    print(f"checkpoints at the kill: {killed_at}")
