"""A tenant's training does not depend on its neighbours: with seeded rollouts
(``fault.deterministic``), a task trained among the other tenants commits, byte
for byte, the adapters and optimizer states it commits trained alone. Sharing
the server and the trainer changes when a step runs, not what it computes.
Slow (``make test-live``): it shares the session's reference run."""

from __future__ import annotations

import pytest
import yaml

from tests.support.paths import REPO
from tests.support.runs import (
    DETERMINISTIC,
    TASKS,
    contents,
    marlaas_train,
    one_thread_env,
    small_run,
)

pytestmark = [pytest.mark.slow, pytest.mark.vllm]


def test_a_task_among_tenants_commits_what_it_commits_alone(
    tmp_path, vllm_server, reference_run
):
    # The last task of the quickstart, as the only task of its own run.
    alone_task = TASKS[-1]
    spec = yaml.safe_load((REPO / "configs" / "tasks" / "quickstart.yaml").read_text())
    only = [t for t in spec["tasks"] if t["name"] == alone_task]
    tasks_file = tmp_path / "alone.yaml"
    tasks_file.write_text(yaml.safe_dump({"tasks": only}))
    argv = small_run(tmp_path, vllm_server.address, "alone")
    # small_run sizes three tasks; keep task 0's sizes for the one task here.
    argv = [a for a in argv if not a.startswith(("tasks.1.", "tasks.2."))]
    proc, _ = marlaas_train(
        [*argv, f"tasks_file={tasks_file}", *DETERMINISTIC], one_thread_env()
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    together = contents(reference_run)
    alone = contents(tmp_path / "marlaas-quickstart" / "alone")
    mine = {k: v for k, v in together.items() if k.startswith(f"{alone_task}/")}
    assert len(alone) == len(mine) >= 3 * 2  # v0..v2, adapter + optimizer
    assert alone == mine
