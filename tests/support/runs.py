"""Small ``marlaas train`` runs and what their run directories must show:
the quickstart's tasks sized down, a run in its own process, the run-dir
contract, and digests of committed adapters and optimizer states."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time

import torch

from areal_marlaas.rundir.reader import read_jsonl
from tests.support.paths import REPO

TASKS = ("add2", "mul1", "add1")


def overlaps(a: dict, b: dict) -> bool:
    return a["start"] < b["end"] and b["start"] < a["end"]


def small_run(tmp_path, address: str, trial: str) -> list[str]:
    """3 tasks x 2 steps of 2 prompts x 2 samples on the shared test server."""
    overrides = [f"cluster.fileroot={tmp_path}", f"trial_name={trial}"]
    overrides.append(f'server.addresses=["{address}"]')
    for i in range(3):
        overrides += [
            f"tasks.{i}.total_steps=2",
            f"tasks.{i}.batch_size=2",
            f"tasks.{i}.n_samples=2",
            f"tasks.{i}.max_new_tokens=24",
        ]
    return ["--config", str(REPO / "configs" / "quickstart.yaml"), *overrides]


# A run that commits the same bytes every time on the same server: seeded
# sampling, the in-process trainer, one compute thread (a Ray worker's cpu=1;
# with 2 threads the float sums of the backward pass round differently).
DETERMINISTIC = ["scheduler.type=null", "fault.deterministic=true"]


def one_thread_env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def train_on_local_scheduler(tmp_path, address: str, trial: str, extra: list[str]):
    """``marlaas train`` (its own process, the LocalScheduler default) on the
    small run plus ``extra``; returns the process and its run directory."""
    (tmp_path / "nr").mkdir()
    argv = small_run(tmp_path, address, trial)
    argv += [f"cluster.name_resolve.nfs_record_root={tmp_path / 'nr'}", *extra]
    proc = subprocess.run(
        [sys.executable, "-m", "areal_marlaas.train", *argv],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO,
    )
    return proc, tmp_path / "marlaas-quickstart" / trial


def marlaas_train(argv: list[str], env: dict[str, str], timeout: float = 900):
    """``marlaas train`` in its own process: the process and its wall seconds."""
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "areal_marlaas.cli", "train", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    return proc, time.monotonic() - t0


def check_run_dir(run, tasks: tuple[str, ...] = TASKS, steps_each: int = 2) -> None:
    """What steps.jsonl, events.jsonl and summary.json must show of ``tasks``."""
    # Every task committed versions 1..steps_each, each on its own fresh data.
    steps = read_jsonl(run / "steps.jsonl")
    for task in tasks:
        mine = [s for s in steps if s["task"] == task]
        assert [s["version"] for s in mine] == list(range(1, steps_each + 1))
        assert all(s["staleness_max"] == 0 for s in mine)
        assert all(s["n_trajectories"] == 4 for s in mine)
    # Cross-task overlap: some rollout ran while another task trained.
    events = [e for e in read_jsonl(run / "events.jsonl") if "phase" in e]
    rollouts = [e for e in events if e["phase"] == "rollout"]
    trains = [e for e in events if e["phase"] == "train"]
    assert any(
        overlaps(r, t) for r in rollouts for t in trains if r["task"] != t["task"]
    )
    assert {e["phase"] for e in events} >= {"rollout", "queue", "train", "publish"}
    # The summary the benchmarks read.
    saved = json.loads((run / "summary.json").read_text())
    assert saved["mode"] == "async" and saved["train_steps_per_hour"] > 0
    for task in tasks:
        t = saved["tasks"][task]
        final = (t["steps"], t["final_version"], t["status"])
        assert final == (steps_each, steps_each, "done")
        assert t["ttfs_s"] > 0 and t["tpts_p50_s"] > 0


def tiny_tasks(n: int, steps: int) -> list[str]:
    out = []
    for i in range(n):
        out += [f"tasks.{i}.total_steps={steps}", f"tasks.{i}.batch_size=2"]
        out += [f"tasks.{i}.n_samples=2", f"tasks.{i}.max_new_tokens=16"]
    return out


def write_two_tasks(path) -> None:
    path.write_text(
        "tasks:\n"
        "  - {name: add2, kind: addition, dataset: {digits: 2}, seed: 1}\n"
        "  - {name: mul1, kind: multiplication, dataset: {digits: 1}, seed: 2}\n"
    )


def digests(run) -> dict[str, str]:
    """sha256 of every file of every committed adapter version (read-only: no
    RunStore, whose resume would already reconcile the logs)."""
    out = {}
    for state in sorted(run.glob("tasks/*/state.json")):
        task, newest = state.parent.name, json.loads(state.read_text())["version"]
        for v in range(newest + 1):
            for f in sorted((state.parent / "adapters" / f"v{v}").iterdir()):
                digest = hashlib.sha256(f.read_bytes()).hexdigest()
                out[f"{task}/v{v}/{f.name}"] = digest
    return out


def versions_by_task(run) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for s in read_jsonl(run / "steps.jsonl"):
        out.setdefault(s["task"], []).append(s["version"])
    return out


def _canonical(obj, h) -> None:
    """Feed ``obj`` (a loaded optimizer.pt) into ``h`` by value."""
    if isinstance(obj, dict):
        for k in sorted(obj, key=str):
            h.update(repr(k).encode())
            _canonical(obj[k], h)
    elif isinstance(obj, (list, tuple)):
        h.update(f"[{len(obj)}".encode())
        for x in obj:
            _canonical(x, h)
    elif torch.is_tensor(obj):
        t = obj.to_local() if hasattr(obj, "to_local") else obj
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(
            t.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes()
        )
    else:
        h.update(repr(obj).encode())


def contents(run) -> dict[str, str]:
    """``digests``, with each optimizer.pt hashed by value: torch.save writes a
    random serialization id into every file, so equal states differ in bytes."""
    out = digests(run)
    for key in [k for k in out if k.endswith("optimizer.pt")]:
        task, version, name = key.split("/")
        path = run / "tasks" / task / "adapters" / version / name
        h = hashlib.sha256()
        _canonical(torch.load(path, map_location="cpu", weights_only=False), h)
        out[key] = h.hexdigest()
    return out


def step_outcomes(run) -> dict[tuple[str, int], tuple]:
    """What each committed step saw and did, per (task, version)."""
    return {
        (s["task"], s["version"]): (s["reward_mean"], s["loss"], s["grad_norm"])
        for s in read_jsonl(run / "steps.jsonl")
    }
