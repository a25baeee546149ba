"""``scheduler.type=ray`` end to end (``make test-live``): the quickstart with
two trainer workers on a local Ray head (the run-dir contract, placement, Ray's
state API, and adapters byte-identical to an in-process run). The trainer and
the rollout worker on different nodes, and the job service under Ray, run
across two real hosts (test_two_hosts_e2e.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from areal_marlaas.rollout.server import free_port
from tests.support.runs import check_run_dir, contents, marlaas_train, small_run

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

RAY = str(Path(sys.executable).parent / "ray")
# The head's logical CPUs: the three workers' (two trainers, one rollout).
HEAD_CPUS = 3
# What a 2-core machine's head can hold (Ray's CPUs and memory are logical).
SMALL = [
    "actor.scheduling_spec.0.cpu=1",
    "actor.scheduling_spec.0.mem=1",
    "rollout.scheduling_spec.0.cpu=1",
    "rollout.scheduling_spec.0.mem=1",
]


@dataclass
class Head:
    address: str
    dashboard: str  # where Ray's state API answers

    def env(self) -> dict[str, str]:
        return {**os.environ, "RAY_ADDRESS": self.address}


def state(kind: str, head: Head) -> list:
    """Ray's state API (the dashboard may take a moment to answer)."""
    from ray.util import state as ray_state

    fn = getattr(ray_state, f"list_{kind}")
    for attempt in range(30):
        try:
            return fn(address=head.dashboard, detail=True, limit=10000)
        except Exception:
            if attempt == 29:
                raise
            time.sleep(2)
    return []


def workers(head: Head) -> dict[str, object]:
    """AReaL's worker actors, by name (role/index)."""
    return {a.name: a for a in state("actors", head) if a.class_name == "RayRPCServer"}


@pytest.fixture
def ray_head(monkeypatch, tmp_path):
    """``ray start --head --num-cpus 3 --num-gpus 0`` (with the dashboard,
    which serves the state API), in the foreground (``--block``) of
    its own session: its processes share its fate, so ending it ends this head
    and no other Ray on the machine (``ray stop`` would stop them all)."""
    monkeypatch.setenv("RAY_memory_monitor_refresh_ms", "0")
    port, dash = free_port(), free_port()
    log = tmp_path / "ray_head.log"
    with open(log, "w") as out:
        head = subprocess.Popen(
            [RAY, "start", "--head", "--block", f"--port={port}"]
            + [f"--num-cpus={HEAD_CPUS}"]
            + ["--num-gpus=0", f"--dashboard-port={dash}", "--disable-usage-stats"],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 300
        while True:
            assert head.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            up = subprocess.run(
                [RAY, "status", f"--address=127.0.0.1:{port}"],
                capture_output=True,
                timeout=120,
            )
            if up.returncode == 0:
                break
            time.sleep(1)
        yield Head(f"127.0.0.1:{port}", f"http://127.0.0.1:{dash}")
    finally:
        head.terminate()
        try:
            head.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait()


def adapters_of(run: Path) -> list[Path]:
    return sorted(run.glob("tasks/*/adapters/v*/adapter_model.safetensors"))


def test_quickstart_on_a_local_ray_head_matches_an_in_process_run(
    tmp_path, vllm_server, ray_head, reference_run
):
    """The quickstart under Ray with two trainer workers: refused at once with
    AReaL's default specs; with small specs each task trains on the worker it
    was placed on (each worker its own Ray actor and placement group) and
    commits the in-process reference run's bytes."""
    argv = [*small_run(tmp_path, vllm_server.address, "ray"), "scheduler.type=ray"]
    argv += [f"cluster.name_resolve.nfs_record_root={tmp_path / 'nr'}"]
    argv += ["fault.deterministic=true", "scheduler.trainers=2"]

    # A new user's first try (AReaL's default specs: 8 CPUs, 32 GiB per worker)
    # now stops before placing anything, naming the fields and the fix.
    failed, failed_s = marlaas_train(argv, ray_head.env())
    assert failed.returncode == 2, failed.stdout[-2000:] + failed.stderr[-3000:]
    for field in ("actor.scheduling_spec.0.cpu=8", "rollout.scheduling_spec.0.mem=32"):
        assert field in failed.stderr
    assert f"set actor.scheduling_spec.0.cpu={HEAD_CPUS} or less" in failed.stderr
    assert not state("placement_groups", ray_head)  # nothing was placed

    done, ray_s = marlaas_train([*argv, *SMALL], ray_head.env())

    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run = tmp_path / "marlaas-quickstart" / "ray"
    check_run_dir(run)  # contiguous versions, staleness audit, cross-task overlap
    assert len(adapters_of(run)) == 3 * 3  # v0..v2 of each task
    # Each task trained only on the worker it was placed on (arrival order,
    # fewest tasks first).
    steps = [json.loads(x) for x in (run / "steps.jsonl").read_text().splitlines()]
    placed = {s["task"]: s["trainer"] for s in steps}
    assert placed == {"add2": 0, "mul1": 1, "add1": 0}
    assert all(s["trainer"] == placed[s["task"]] for s in steps)
    # Ray's state API: the trainers and the rollout worker ran as Ray actors,
    # and every placement group was removed at the end.
    created = workers(ray_head)
    assert set(created) == {"actor/0", "actor1/0", "rollout/0"}, created
    assert all(a.state == "DEAD" for a in created.values())
    groups = state("placement_groups", ray_head)
    assert len(groups) == 3 and all(g.state == "REMOVED" for g in groups), groups

    # The same run in-process (same server, seeds and data order), with the
    # Ray workers' thread count (their spec's cpu=1): the session's reference
    # run. Where a task trains changes when its steps run, not what they compute.
    under_ray, in_process = contents(run), contents(reference_run)
    assert len(under_ray) == len(in_process) >= 3 * 3 * 2
    assert under_ray == in_process  # adapters by bytes, optimizer states by value
    n = sum(k.endswith(".safetensors") for k in under_ray)
    setup = {
        name: json.loads((path / "summary.json").read_text())["timings"]["setup_s"]
        for name, path in (("ray", run), ("ref", reference_run))
    }
    print(
        f"ray: default specs refused in {failed_s:.1f}s; run {ray_s:.1f}s (set-up "
        f"{setup['ray']:.1f}s) vs in-process set-up {setup['ref']:.1f}s; "
        f"{n} adapters byte-identical"
    )
