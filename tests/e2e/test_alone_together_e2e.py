"""A tenant's training does not depend on its neighbours: with seeded rollouts
(``fault.deterministic``), a task trained among the other tenants commits, byte
for byte, the adapters and optimizer states it commits trained alone. Sharing
the server and the trainer changes when a step runs, not what it computes."""

from __future__ import annotations

import os

import yaml

from tests.conftest import REPO

from .test_fault_e2e import contents
from .test_train_e2e import TASKS, marlaas_train, small_run


def train(argv: list[str]) -> None:
    proc, _ = marlaas_train(argv, dict(os.environ))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_a_task_among_tenants_commits_what_it_commits_alone(tmp_path, vllm_server):
    common = ["scheduler.type=null", "fault.deterministic=true"]
    train([*small_run(tmp_path, vllm_server.address, "together"), *common])

    # The last task of the quickstart, as the only task of its own run.
    alone_task = TASKS[-1]
    spec = yaml.safe_load((REPO / "configs" / "tasks" / "quickstart.yaml").read_text())
    only = [t for t in spec["tasks"] if t["name"] == alone_task]
    tasks_file = tmp_path / "alone.yaml"
    tasks_file.write_text(yaml.safe_dump({"tasks": only}))
    argv = small_run(tmp_path, vllm_server.address, "alone")
    # small_run sizes three tasks; keep task 0's sizes for the one task here.
    argv = [a for a in argv if not a.startswith(("tasks.1.", "tasks.2."))]
    train([*argv, f"tasks_file={tasks_file}", *common])

    root = tmp_path / "marlaas-quickstart"
    together, alone = contents(root / "together"), contents(root / "alone")
    mine = {k: v for k, v in together.items() if k.startswith(f"{alone_task}/")}
    assert len(alone) == len(mine) >= 3 * 2  # v0..v2, adapter + optimizer
    assert alone == mine
