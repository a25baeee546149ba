"""Usage per tenant, live: after real jobs of two tenants ran on ``marlaas
service``, what the API reports (each job's ``usage``, the operator's
``/v1/admin/usage``) is the sum over the run directory's step records, which
the trainer writes independently of the job database."""

from __future__ import annotations

import json

import httpx
import pytest

from areal_marlaas.service.store import task_name_of
from tests.service_live import (
    BASE,
    CONFIG,
    STRING_CHECK,
    LiveService,
    lines,
    method,
    wait_all,
)

# A live service with its own server and trainer (~3 min): make test-service.
pytestmark = [pytest.mark.vllm, pytest.mark.slow]

TENANTS = {"acme": 2, "globex": 1}  # jobs each


def test_api_usage_is_the_sum_of_the_run_directorys_step_records(tmp_path):
    live = LiveService(
        tmp_path / "svc",
        [
            "service.max_new_tokens=16",
            "service.max_prompt_tokens=96",
            "service.poll_interval_s=0.3",
        ],
    )
    clients = {name: live.add_tenant(name) for name in TENANTS}
    admin = live.marlaas("service", "admin-key", "--config", CONFIG, *live.overrides)
    with live.running():
        mine: dict[str, list[str]] = {}
        for i, (name, c) in enumerate(clients.items()):
            for j in range(TENANTS[name]):
                f = c.files.create(
                    file=("a.jsonl", lines(4, 10 * i + j)), purpose="fine-tune"
                )
                job = c.fine_tuning.jobs.create(
                    model=BASE, training_file=f.id, method=method(STRING_CHECK)
                )
                mine.setdefault(name, []).append(job.id)
        done = {name: wait_all(clients[name], ids, 900) for name, ids in mine.items()}
        base = f"http://127.0.0.1:{live.port}"
        auth = {"Authorization": f"Bearer {admin.strip()}"}
        body = httpx.get(f"{base}/v1/admin/usage", headers=auth).json()

    run = tmp_path / "svc" / "runs" / "marlaas-service" / "service"
    records = [json.loads(x) for x in (run / "steps.jsonl").read_text().splitlines()]
    tenants = {t["tenant"]: t for t in body["tenants"]}
    for name, jobs in done.items():
        tasks = set()
        for job in jobs.values():
            assert job.status == "succeeded", (job, live.tail())
            task = task_name_of(job.id)
            tasks.add(task)
            steps = [r for r in records if r["task"] == task]
            assert [r["version"] for r in steps] == [1, 2]
            usage = job.usage  # type: ignore[attr-defined]
            assert usage["trainer_s"] == pytest.approx(sum(r["train_s"] for r in steps))
            tokens = sum(r["trained_tokens"] for r in steps)
            assert tokens > 0
            assert usage["generated_tokens"] == usage["trained_tokens"] == tokens
        theirs = [r for r in records if r["task"] in tasks]
        assert tenants[name]["jobs"] == TENANTS[name]
        assert tenants[name]["trainer_s"] == pytest.approx(
            sum(r["train_s"] for r in theirs)
        )
        assert tenants[name]["trained_tokens"] == sum(
            r["trained_tokens"] for r in theirs
        )
