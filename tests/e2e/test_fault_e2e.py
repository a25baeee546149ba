"""Faults in real runs: a SIGKILLed trainer resumes, a tenant whose reward raises
(or whose dataset is missing) fails alone, a killed vLLM server is restarted."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

from areal_marlaas.config import load_config
from areal_marlaas.rollout.reaper import group_members
from areal_marlaas.rundir.reader import read_jsonl
from areal_marlaas.train.trainer import MultiTaskTrainer
from tests.conftest import REPO
from tests.helpers import LeaseLog

pytestmark = pytest.mark.vllm

CONFIG = str(REPO / "configs" / "quickstart.yaml")


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


# ~280 s on 2 CPU cores (three trainer starts, 16 steps): over the default
# suite's budget. The default suite covers its parts: reconcile (test_fault.py),
# the optimizer-state resume and logprob recompute (test_fault_engine.py), and
# batch-independent seeded sampling (test_seeding.py).
@pytest.mark.slow
def test_sigkilled_trainer_resumes_with_contiguous_versions(tmp_path, vllm_server):
    tasks = tmp_path / "tasks.yaml"
    write_two_tasks(tasks)
    common = [sys.executable, "-m", "areal_marlaas.cli", "train", "--config", CONFIG]
    common += ["--tasks", str(tasks), f"cluster.fileroot={tmp_path}"]
    common += ["scheduler.type=null", f'server.addresses=["{vllm_server.address}"]']
    common += ["fault.deterministic=true", *tiny_tasks(2, 4)]
    argv = [*common, "trial_name=kill"]
    run = tmp_path / "marlaas-quickstart" / "kill"
    log = open(tmp_path / "first.log", "w")  # noqa: SIM115 (the child writes it)
    first = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)

    def committed() -> int:
        states = [run / "tasks" / t / "state.json" for t in ("add2", "mul1")]
        return max(
            (json.loads(p.read_text())["version"] for p in states if p.is_file()),
            default=0,
        )

    deadline = time.monotonic() + 600
    while committed() < 2 and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
    first.send_signal(signal.SIGKILL)
    first.wait()
    before = digests(run)
    done_before = {t: v for t, v in versions_by_task(run).items()}
    assert max(len(v) for v in done_before.values()) >= 2

    second = subprocess.run(
        [*argv, "--resume"], capture_output=True, text=True, timeout=900
    )

    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert versions_by_task(run) == {"add2": [1, 2, 3, 4], "mul1": [1, 2, 3, 4]}
    after = digests(run)
    assert {k: after[k] for k in before} == before  # committed files untouched
    assert any(k.endswith("optimizer.pt") for k in before)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["resumed"] is True
    for t in ("add2", "mul1"):
        assert summary["tasks"][t]["status"] == "done"
        assert summary["tasks"][t]["final_version"] == 4

    # The same run, never interrupted (same server, seeds and data order).
    ref = subprocess.run(
        [*common, "trial_name=ref"], capture_output=True, text=True, timeout=900
    )
    assert ref.returncode == 0, ref.stdout[-3000:] + ref.stderr[-3000:]
    uninterrupted = contents(tmp_path / "marlaas-quickstart" / "ref")
    resumed = contents(run)
    assert len(uninterrupted) == len(resumed) >= 2 * 5 * 2
    # Every adapter (bytes) and optimizer state (values), committed before the
    # crash or after the resume, is identical to the uninterrupted run's.
    assert {k: uninterrupted[k] for k in before} == {k: resumed[k] for k in before}
    assert uninterrupted == resumed
    assert step_outcomes(tmp_path / "marlaas-quickstart" / "ref") == step_outcomes(run)
    print(
        f"killed after commits {done_before}; resumed to 4/4 for both tasks; "
        f"{len(resumed)} committed files identical to the uninterrupted run's"
    )


def test_raising_reward_and_missing_dataset_fail_alone(tmp_path, vllm_server):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "1+1?", "answer": "#### 2"}\n{"question": \n')
    tasks = tmp_path / "tasks.yaml"
    tasks.write_text(
        "tasks:\n"
        "  - {name: add2, kind: addition}\n"
        "  - {name: mul1, kind: multiplication,\n"
        "     reward_fn: tests.unit.test_fault.raising_reward}\n"
        "  - {name: add1, kind: addition, dataset: {digits: 1}}\n"
        "  - {name: gsm, kind: gsm8k, dataset: {path: /nonexistent.jsonl}}\n"
        f"  - {{name: gsm_bad, kind: gsm8k, dataset: {{path: {bad}}}}}\n"
    )
    overrides = ["--config", CONFIG, "--tasks", str(tasks)]
    overrides += [f"cluster.fileroot={tmp_path}", "trial_name=iso"]
    overrides += ["scheduler.type=null", f'server.addresses=["{vllm_server.address}"]']
    overrides += tiny_tasks(5, 1) + ["scheduler.task_retries=1"]
    cfg, _ = load_config(overrides)

    summary = MultiTaskTrainer(cfg).run()

    tasks = summary["tasks"]
    assert tasks["add2"]["status"] == tasks["add1"]["status"] == "done"
    assert tasks["add2"]["final_version"] == tasks["add1"]["final_version"] == 1
    assert tasks["mul1"]["status"] == "failed"
    assert "reward_fn raised ValueError: tenant bug" in tasks["mul1"]["error"]
    assert "(failed 2x at v0)" in tasks["mul1"]["error"]  # retried once
    assert tasks["gsm"]["status"] == "failed"
    assert "not found" in tasks["gsm"]["error"]
    assert "bad.jsonl:2: not valid JSON" in tasks["gsm_bad"]["error"]
    run = tmp_path / "marlaas-quickstart" / "iso"
    failed = {
        e["task"]: e["reason"]
        for e in read_jsonl(run / "events.jsonl")
        if e.get("status") == "failed"
    }
    assert set(failed) == {"mul1", "gsm", "gsm_bad"}
    saved = json.loads((run / "summary.json").read_text())
    assert saved["tasks"]["mul1"]["status"] == "failed"


def test_failed_save_after_a_train_step_is_retried_in_place(
    tmp_path, vllm_server, monkeypatch
):
    from areal_marlaas.train.engine import MultiLoRAFSDPPPOActor

    real_save = MultiLoRAFSDPPPOActor.save_adapter
    failures = []

    def flaky_save(self, name, path):
        # A full disk, once, on add2's first new version (a fake: a real write
        # error cannot be provoked here, and root ignores read-only folders).
        if name == "add2" and str(path).endswith("v1") and not failures:
            failures.append(str(path))
            raise OSError(28, "No space left on device")
        return real_save(self, name, path)

    monkeypatch.setattr(MultiLoRAFSDPPPOActor, "save_adapter", flaky_save)
    tasks = tmp_path / "tasks.yaml"
    write_two_tasks(tasks)
    overrides = ["--config", CONFIG, "--tasks", str(tasks)]
    overrides += [f"cluster.fileroot={tmp_path}", "trial_name=save"]
    overrides += ["scheduler.type=null", f'server.addresses=["{vllm_server.address}"]']
    overrides += tiny_tasks(2, 2)  # task_retries stays 0: no phase retry may help
    cfg, _ = load_config(overrides)

    summary = MultiTaskTrainer(cfg).run()

    assert len(failures) == 1
    for name in ("add2", "mul1"):
        assert summary["tasks"][name]["status"] == "done", summary["tasks"][name]
        assert summary["tasks"][name]["final_version"] == 2
    run = tmp_path / "marlaas-quickstart" / "save"
    assert versions_by_task(run) == {"add2": [1, 2], "mul1": [1, 2]}
    adapter = run / "tasks" / "add2" / "adapters" / "v1"
    assert (adapter / "adapter_model.safetensors").is_file()
    assert (adapter / "optimizer.pt").is_file()


@pytest.mark.slow
def test_vllm_server_killed_mid_rollout_is_restarted_and_run_completes(tmp_path):
    tasks = tmp_path / "tasks.yaml"
    write_two_tasks(tasks)
    overrides = ["--config", CONFIG, "--tasks", str(tasks)]
    overrides += [f"cluster.fileroot={tmp_path}", "trial_name=srv"]
    overrides += ["scheduler.type=null", "server.cpu_kvcache_space_gib=1"]
    overrides += tiny_tasks(2, 2) + ["scheduler.task_retries=2"]
    overrides += ["fault.health_interval_s=1", "fault.health_timeout_s=2"]
    overrides += ["fault.health_failures=2"]
    cfg, _ = load_config(overrides)
    trainer = MultiTaskTrainer(cfg)
    killed: dict[str, float] = {}

    def kill_during_a_rollout() -> None:
        log = LeaseLog()
        while "t" not in killed:
            session = trainer.session
            engine = session.engine if session else None
            if engine is not None and session.supervisor is not None:
                engine.adapters.listener = engine.adapters.listener or log
                inflight = [r for r in log.leases if r[2] is None]
                if inflight and len(log.leases) > 8:
                    pgid = session.server.process.pid
                    for pid in group_members(pgid):
                        if pid != pgid:
                            os.kill(pid, signal.SIGKILL)
                    killed["t"] = time.time()
                    return
            time.sleep(0.05)

    threading.Thread(target=kill_during_a_rollout, daemon=True).start()
    summary = trainer.run()

    assert "t" in killed
    for t in ("add2", "mul1"):
        assert summary["tasks"][t]["status"] == "done", summary["tasks"][t]
        assert summary["tasks"][t]["final_version"] == 2
    assert versions_by_task(tmp_path / "marlaas-quickstart" / "srv") == {
        "add2": [1, 2],
        "mul1": [1, 2],
    }
    (r,) = summary["server_restarts"]
    assert r["ok"] and "exited" in r["reason"] and r["adapters"] == 2
    print(
        f"server killed; detected in {r['t'] - killed['t']:.1f}s, restarted in "
        f"{r['restart_s']:.1f}s, adapters reloaded in {r['reload_s']:.2f}s"
    )
