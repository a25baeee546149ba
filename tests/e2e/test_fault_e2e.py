"""Faults in real runs: a SIGKILLed trainer resumes, a tenant whose reward raises
(or whose dataset is missing) fails alone, a killed vLLM server is restarted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from areal_marlaas.config import load_config
from areal_marlaas.rollout.reaper import group_members
from areal_marlaas.rundir.reader import read_jsonl
from areal_marlaas.train.trainer import MultiTaskTrainer
from tests.support.leases import LeaseLog
from tests.support.paths import REPO
from tests.support.runs import (
    DETERMINISTIC,
    TASKS,
    contents,
    digests,
    one_thread_env,
    small_run,
    step_outcomes,
    tiny_tasks,
    versions_by_task,
    write_two_tasks,
)

pytestmark = pytest.mark.vllm

CONFIG = str(REPO / "configs" / "quickstart.yaml")


# Two trainer starts and the session's reference run: over the default suite's
# budget. The default suite covers its parts: reconcile (test_fault.py), the
# optimizer-state resume and logprob recompute (test_fault_engine.py), and
# batch-independent seeded sampling (test_seeding.py).
@pytest.mark.slow
def test_sigkilled_trainer_resumes_with_contiguous_versions(
    tmp_path, vllm_server, reference_run
):
    argv = [sys.executable, "-m", "areal_marlaas.cli", "train"]
    argv += [*small_run(tmp_path, vllm_server.address, "kill"), *DETERMINISTIC]
    run = tmp_path / "marlaas-quickstart" / "kill"
    log = open(tmp_path / "first.log", "w")  # noqa: SIM115 (the child writes it)
    first = subprocess.Popen(
        argv, stdout=log, stderr=subprocess.STDOUT, env=one_thread_env()
    )

    def committed() -> int:
        states = [run / "tasks" / t / "state.json" for t in TASKS]
        return sum(json.loads(p.read_text())["version"] for p in states if p.is_file())

    # Killed once a step is committed: 5 of the run's 6 still to come.
    deadline = time.monotonic() + 600
    while committed() < 1 and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
    first.send_signal(signal.SIGKILL)
    first.wait()
    before = digests(run)
    done_before = versions_by_task(run)
    assert sum(map(len, done_before.values())) < 2 * len(TASKS), done_before

    second = subprocess.run(
        [*argv, "--resume"],
        capture_output=True,
        text=True,
        timeout=900,
        env=one_thread_env(),
    )

    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert versions_by_task(run) == {t: [1, 2] for t in TASKS}
    after = digests(run)
    assert {k: after[k] for k in before} == before  # committed files untouched
    assert any(k.endswith("optimizer.pt") for k in before)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["resumed"] is True
    for t in TASKS:
        assert summary["tasks"][t]["status"] == "done"
        assert summary["tasks"][t]["final_version"] == 2

    # The same run, never interrupted (same server, seeds and data order).
    uninterrupted, resumed = contents(reference_run), contents(run)
    assert len(uninterrupted) == len(resumed) >= 3 * 3 * 2
    # Every adapter (bytes) and optimizer state (values), committed before the
    # crash or after the resume, is identical to the uninterrupted run's.
    assert {k: uninterrupted[k] for k in before} == {k: resumed[k] for k in before}
    assert uninterrupted == resumed
    assert step_outcomes(reference_run) == step_outcomes(run)
    print(
        f"killed after commits {done_before}; resumed to 2/2 for every task; "
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
        "     reward_fn: tests.support.rewards.raising_reward}\n"
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

    def kill_the_server() -> None:
        pgid = trainer.session.server.process.pid
        for pid in group_members(pgid):
            if pid != pgid:
                os.kill(pid, signal.SIGKILL)
        killed["t"] = time.time()

    class KillOnTheNinthLease(LeaseLog):
        """Kills the server as the 9th request (of the second round) is sent:
        that request, at least, is in flight."""

        def leased(self, name: str, start: float) -> None:
            super().leased(name, start)
            if len(self.leases) == 9:
                kill_the_server()

    def kill_during_a_rollout() -> None:
        # Waits for the engine to exist (a state that stays), then listens.
        while True:
            session = trainer.session
            engine = session.engine if session else None
            if engine is not None and session.supervisor is not None:
                engine.adapters.listener = KillOnTheNinthLease()
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
