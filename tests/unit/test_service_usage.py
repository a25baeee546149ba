"""Tenants' weights and usage accounting in the service: the job store sums
what the scheduler records per step and eval; the job object, the operator's
usage endpoint, /metrics and `marlaas service status` show the same sums."""

from __future__ import annotations

import httpx
import openai
import pytest

from areal_marlaas.service import eval_runs
from areal_marlaas.service.auth import new_admin_key
from areal_marlaas.service.status import format_status
from areal_marlaas.service.store import StepUsage
from areal_marlaas.service.tables import QUEUED, RUNNING, VALIDATING
from tests.support.service_api import create_job, service_fixture, upload

svc = service_fixture()

STEPS = [StepUsage(2.5, 40, 40), StepUsage(3.0, 44, 44), StepUsage(1.25, 38, 38)]


def running(svc, client):
    job = create_job(client, upload(client).id)
    for status in (VALIDATING, QUEUED, RUNNING):
        svc.store.set_status(job.id, status)
    svc.store.set_plan(job.id, steps_total=5)
    return job


def test_usage_sums_every_step_and_eval_per_job_and_per_tenant(svc):
    name = "usage-a"
    tenant, key = svc.store.create_tenant(name)
    a = openai.OpenAI(base_url=svc.api.base_url, api_key=key)
    jobs = [running(svc, a), running(svc, a)]
    for i, u in enumerate(STEPS):
        svc.store.record_step(jobs[i % 2].id, i // 2 + 1, {}, usage=u)
    eval_id = svc.store.ensure_eval(jobs[0].id, [])
    svc.store.record_eval_run(eval_id, 1, "m", "completed", {}, [], eval_tokens=17)

    first = a.fine_tuning.jobs.retrieve(jobs[0].id).usage  # type: ignore[attr-defined]
    assert first["trainer_s"] == pytest.approx(2.5 + 1.25)
    assert first["generated_tokens"] == 40 + 38
    assert first["eval_tokens"] == 17
    total = svc.store.usage_by_tenant()[name]
    assert total["trainer_s"] == pytest.approx(sum(u.trainer_s for u in STEPS))
    assert total["generated_tokens"] == sum(u.generated_tokens for u in STEPS)
    assert total["trained_tokens"] == sum(u.trained_tokens for u in STEPS)
    assert total["eval_tokens"] == 17 and total["jobs"] == 2

    admin = new_admin_key(svc.cfg.admin_key_path)
    base = svc.api.base_url.removesuffix("/v1")
    auth = {"Authorization": f"Bearer {admin}"}
    body = httpx.get(f"{base}/v1/admin/usage", headers=auth).json()
    mine = next(t for t in body["tenants"] if t["tenant"] == name)
    assert mine["trainer_s"] == pytest.approx(total["trainer_s"])
    assert {j["job"] for j in body["jobs"] if j["tenant"] == name} == {
        j.id for j in jobs
    }
    metrics = httpx.get(f"{base}/metrics", headers=auth).text
    assert f'marlaas_tenant_trainer_seconds_total{{tenant="{name}"}} 6.75' in metrics
    assert f'marlaas_tenant_eval_tokens_total{{tenant="{name}"}} 17.0' in metrics
    assert f"{name}: 6.8s, 122 / " in format_status(svc.store)
    # A tenant's key reads its jobs' usage, never the operator's view.
    r = httpx.get(f"{base}/v1/admin/usage", headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 401


def test_a_tenants_weight_is_set_listed_and_reaches_its_jobs_tasks(svc, tmp_path):
    tenant, _ = svc.store.create_tenant("heavy-w", weight=2.0)
    assert svc.store.tenant_weights()[tenant.id] == 2.0
    svc.store.set_weight("heavy-w", 0.5)
    info = next(t for t in svc.store.list_tenants() if t.name == "heavy-w")
    assert info.weight == 0.5
    for bad in (0, -1.0, float("nan"), 1e9):
        with pytest.raises(ValueError, match="weight must be a number in"):
            svc.store.set_weight("heavy-w", bad)
    with pytest.raises(ValueError, match="weight must be"):
        svc.store.create_tenant("zero-w", weight=0)
    assert "zero-w" not in {t.name for t in svc.store.list_tenants()}


def test_eval_output_items_carry_their_token_counts():
    sample = {
        "index": 0,
        "item": {"messages": [{"role": "user", "content": "1+1?"}]},
        "prompt": "1+1?",
        "output": "2",
        "reward": 1.0,
        "grades": [],
        "prompt_tokens": 12,
        "output_tokens": 3,
    }
    ((_, _, body),) = eval_runs.output_items([sample], "m", 1.0, 16)  # type: ignore[list-item]
    assert body["sample"]["usage"] == {
        "cached_tokens": 0,
        "completion_tokens": 3,
        "prompt_tokens": 12,
        "total_tokens": 15,
    }
