"""End to end: 3 tasks x 2 steps through the real vLLM server and the real FSDP
engine, in MARLaaS async mode."""

from __future__ import annotations

import json
from itertools import pairwise

import pytest
import requests
import yaml

from areal_marlaas.config import load_config
from areal_marlaas.rundir.reader import read_jsonl
from areal_marlaas.train.engine import MultiLoRAFSDPPPOActor
from areal_marlaas.train.trainer import MultiTaskTrainer
from tests.support.paths import REPO
from tests.support.runs import (
    TASKS,
    check_run_dir,
    overlaps,
    small_run,
    train_on_local_scheduler,
)
from tests.support.snapshots import (
    assert_bitwise_equal,
    lora_snapshot,
    optimizer_snapshot,
)

pytestmark = pytest.mark.vllm


@pytest.fixture
def isolation_checked(monkeypatch):
    """Wrap every training step: the other tasks' adapters and optimizer states
    must be bitwise identical before and after it."""
    trained: list[str] = []
    original = MultiLoRAFSDPPPOActor.train_task

    def train_task(self, name, batch, valid=None):
        others = {
            t: (lora_snapshot(self, t), optimizer_snapshot(self, t))
            for t in self.slots
            if t != name
        }
        out = original(self, name, batch, valid)
        for t, (weights, optim) in others.items():
            assert_bitwise_equal(lora_snapshot(self, t), weights)
            assert_bitwise_equal(optimizer_snapshot(self, t), optim)
        trained.append(name)
        return out

    monkeypatch.setattr(MultiLoRAFSDPPPOActor, "train_task", train_task)
    return trained


def test_three_tasks_two_steps_async_end_to_end(
    tmp_path, vllm_server, isolation_checked
):
    # In-process engines (scheduler.type=null), so every update can be inspected.
    cfg, _ = load_config(
        [*small_run(tmp_path, vllm_server.address, "e2e"), "scheduler.type=null"]
    )

    summary = MultiTaskTrainer(cfg).run()

    run = tmp_path / "marlaas-quickstart" / "e2e"
    assert summary["run_dir"] == str(run)
    check_run_dir(run)
    # Each update left every other task's adapter and optimizer untouched.
    assert sorted(isolation_checked) == sorted(TASKS * 2)
    # The server serves each task's newest version; older ones were retired.
    base = f"http://{vllm_server.address}"
    models = {m["id"] for m in requests.get(f"{base}/v1/models").json()["data"]}
    for task in TASKS:
        assert f"{task}-v2" in models
        assert f"{task}-v0" not in models and f"{task}-v1" not in models
    # Every committed adapter loads in vLLM and generates.
    for task in TASKS:
        for v in (0, 1, 2):
            name = f"check_{task}_v{v}"
            path = run / "tasks" / task / "adapters" / f"v{v}"
            loaded = requests.post(
                f"{base}/v1/load_lora_adapter",
                json={"lora_name": name, "lora_path": str(path)},
                timeout=60,
            )
            assert loaded.status_code == 200, loaded.text
            out = requests.post(
                f"{base}/v1/completions",
                json={"model": name, "prompt": [1, 4093, 198], "max_tokens": 4},
                timeout=60,
            )
            assert out.status_code == 200 and out.json()["choices"][0]["text"]
            requests.post(
                f"{base}/v1/unload_lora_adapter", json={"lora_name": name}, timeout=60
            )


# Arrival order, fewest tasks first: mul1 (its reward raises) and mul1b share
# worker 1, so worker 1 still trains a task when mul1 fails.
PLACED = {"add2": 0, "mul1": 1, "add1": 0, "mul1b": 1}
HEALTHY = ("add2", "add1", "mul1b")


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory, vllm_server):
    """The CLI default once for this module's checks: AReaL's single controller
    with LocalScheduler workers, two trainer workers (``scheduler.trainers=2``:
    roles actor and actor1), one tenant's reward raising (on this placement the
    rollout runs in an AReaL worker process) and a fourth, healthy tenant."""
    tmp = tmp_path_factory.mktemp("cli")
    # add2 evaluates 4 held-out problems after each step.
    tasks = yaml.safe_load((REPO / "configs" / "tasks" / "quickstart.yaml").read_text())
    tasks["tasks"][0] |= {
        "dataset": {"digits": 2, "size": 2000, "holdout": 0.2},
        "eval_dataset": {"digits": 2, "split": "test", "holdout": 0.2, "size": 64},
        "eval_interval": 1,
        "eval_samples": 4,
    }
    tasks["tasks"].append(tasks["tasks"][1] | {"name": "mul1b", "seed": 4})
    (tmp / "tasks.yaml").write_text(yaml.safe_dump(tasks))
    fourth = [
        "tasks.3.total_steps=2",
        "tasks.3.batch_size=2",
        "tasks.3.n_samples=2",
        "tasks.3.max_new_tokens=24",
    ]
    return train_on_local_scheduler(
        tmp,
        vllm_server.address,
        "cli",
        [
            f"tasks_file={tmp / 'tasks.yaml'}",
            *fourth,
            "scheduler.trainers=2",
            "tasks.1.reward_fn=tests.support.rewards.raising_reward",
            # Seeded sampling: the same batch lengths every run, so the page
            # faults below do not depend on what was sampled.
            "fault.deterministic=true",
        ],
    )


def test_marlaas_train_cli_on_areal_local_scheduler(cli_run):
    """The healthy tenants finish and the table and run directory are printed."""
    proc, run = cli_run

    assert (run / "summary.json").is_file(), proc.stdout[-3000:] + proc.stderr[-3000:]
    check_run_dir(run, tasks=HEALTHY)
    assert f"run dir: {run}" in proc.stdout
    table = [line.split()[:3] for line in proc.stdout.splitlines()]
    assert all([task, "done", "2"] in table for task in HEALTHY), proc.stdout
    assert any(row[:2] == ["mul1", "failed"] for row in table)


def test_held_out_evals_land_in_the_run_directory_and_on_the_screen(cli_run):
    proc, run = cli_run

    evals = [e for e in read_jsonl(run / "evals.jsonl") if e["task"] == "add2"]
    assert [(e["version"], e["samples"]) for e in evals] == [(1, 4), (2, 4)]
    # Generated by the version evaluated, on the server, in an AReaL worker.
    assert [e["versions"] for e in evals] == [[1], [2]]
    assert all(0.0 <= e["reward_mean"] <= 1.0 for e in evals)
    samples = [
        json.loads(line)
        for line in (run / "tasks" / "add2" / "evals" / "v2.jsonl")
        .read_text()
        .splitlines()
    ]
    assert len(samples) == 4 and all(s["output"] and s["prompt"] for s in samples)
    assert sum(s["reward"] for s in samples) / 4 == pytest.approx(
        evals[1]["reward_mean"]
    )
    screen = proc.stdout.splitlines()
    for v in (1, 2):
        assert any(f"add2         eval v{v}: reward " in ln for ln in screen), (
            proc.stdout
        )
    # Evals are rollout-side work: none ever holds a train step.
    events = [e for e in read_jsonl(run / "events.jsonl") if e.get("phase") == "eval"]
    assert {e["version"] for e in events} == {1, 2}


def test_a_reward_raising_in_a_worker_reaches_the_summary(cli_run):
    """Not only "all rollouts failed": the reward's own error, from the worker."""
    proc, run = cli_run

    tasks = json.loads((run / "summary.json").read_text())["tasks"]
    assert tasks["mul1"]["status"] == "failed"
    assert "reward_fn raised ValueError: tenant bug" in tasks["mul1"]["error"]


def test_the_screen_stays_quiet_and_the_workers_output_goes_to_their_logs(cli_run):
    """AReaL INFO lines, gloo and weight-loading bars of the workers' start-up go
    to their log files, not the screen."""
    proc, run = cli_run

    screen = (proc.stdout + proc.stderr).splitlines()
    noise = [ln for ln in screen if " INFO: " in ln or "[Gloo]" in ln]
    noise += [ln for ln in screen if "Loading weights" in ln]
    assert not noise, "\n".join(noise[:10])
    assert len(screen) <= 40, "\n".join(screen)
    assert any("starting the trainer" in ln for ln in screen)
    assert "Guard" in (run / "logs" / "actor.log").read_text()  # kept, not lost


def test_the_trainer_worker_keeps_the_pages_it_frees(cli_run):
    """glibc's defaults fault in 60k+ fresh pages on every step here; a kept heap
    (train/heap.py) faults only where a step needs more than any step before it
    (a longer batch: 32k pages once in CI), so after a worker's first step some
    step reuses the heap outright (0-3.5k seen). Worker 0 trains 4 steps."""
    _, run = cli_run

    steps = read_jsonl(run / "steps.jsonl")
    assert all(s["page_faults"] >= 0 for s in steps)
    after_first = [s["page_faults"] for s in steps if s["trainer"] == 0][1:]
    assert len(after_first) == 3 and min(after_first) < 20_000, after_first


def test_two_trainer_workers_each_train_their_own_tasks(cli_run):
    """Each task is placed on one worker and trained only there, versions in
    order; each worker is its own AReaL role and process."""
    proc, run = cli_run

    assert (run / "summary.json").is_file(), proc.stdout[-3000:] + proc.stderr[-3000:]
    steps = read_jsonl(run / "steps.jsonl")
    assert {s["task"]: s["trainer"] for s in steps} == {t: PLACED[t] for t in HEALTHY}
    assert all(s["trainer"] == PLACED[s["task"]] for s in steps)
    assert (run / "logs" / "actor.log").is_file()
    assert (run / "logs" / "actor1.log").is_file()


def worker_trains(run) -> tuple[dict[int, list[dict]], dict]:
    events = [e for e in read_jsonl(run / "events.jsonl") if e.get("phase")]
    trains = sorted(
        (e for e in events if e["phase"] == "train"), key=lambda e: e["start"]
    )
    ends = {
        (e["task"], e["version"]): e["end"] for e in events if e["phase"] == "rollout"
    }
    worker: dict[int, list[dict]] = {0: [], 1: []}
    for t in trains:
        worker[PLACED[t["task"]]].append(t)
    return worker, ends


def test_two_trainer_workers_train_at_once_but_one_step_each(cli_run):
    worker, _ = worker_trains(cli_run[1])

    for mine in worker.values():
        assert all(a["end"] <= b["start"] for a, b in pairwise(mine))
    assert any(overlaps(a, b) for a in worker[0] for b in worker[1])


def test_no_batch_waits_while_its_trainer_worker_is_idle(cli_run):
    """A batch starts training within 1 s of the later of its rollout's end and
    its worker's last step."""
    worker, ends = worker_trains(cli_run[1])

    for mine in worker.values():
        free_at = 0.0
        for t in mine:
            ready = max(ends[(t["task"], t["version"])], free_at)
            # Dispatched ~0.01 s here after it could be (0.1 s at most); one that
            # waited for the other worker's step would wait seconds (1.7-3.7 s).
            assert t["start"] - ready < 1.0, (t, ready)
            free_at = t["end"]
