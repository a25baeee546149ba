"""The operator's endpoints (admin key; tenants' keys get 401 like any unknown
key). ``/v1/admin/overview``: every tenant's jobs, the queue in admission order,
the trainer's busy fraction, the server's KV usage and the TTFS distribution
(the dashboard's admin page). ``/v1/admin/usage``: what each tenant and each job
used (trainer-seconds, generated, trained and eval tokens)."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool

from areal_marlaas.bench.run_metrics import percentile
from areal_marlaas.service.auth import require_admin
from areal_marlaas.service.deps import AppState, state
from areal_marlaas.service.objects import job_usage
from areal_marlaas.service.status import status_rows
from areal_marlaas.service.tables import QUEUED


def overview(st: AppState) -> dict[str, Any]:
    jobs = status_rows(st.store)
    queued = [j for j in jobs if j["status"] == QUEUED]  # oldest first: admission
    ttfs = [j["ttfs_s"] for j in jobs if j["ttfs_s"] is not None]
    gauges = st.metrics.snapshot()
    usage = st.store.usage_by_tenant()
    return {
        "object": "marlaas.overview",
        "generated_at": time.time(),
        "tenants": [
            {
                "id": t.id,
                "name": t.name,
                "disabled": t.disabled,
                # A tenant added between the two reads has no usage row yet.
                "jobs": usage.get(t.name, {}).get("jobs", 0),
                "weight": t.weight,
                "usage": usage.get(t.name, {}),
            }
            for t in st.store.list_tenants()
        ],
        "jobs": jobs,
        "queue": [
            {
                "position": i + 1,
                "tenant": j["tenant"],
                "job": j["job"],
                "created_at": j["created_at"],
            }
            for i, j in enumerate(queued)
        ],
        "trainer_busy_fraction": gauges["trainer_busy_fraction"],
        "kv_usage_fraction": gauges["kv_usage_fraction"],
        "ttfs_s": ttfs,
        "ttfs_p50_s": percentile(ttfs, 50),
        "ttfs_p95_s": percentile(ttfs, 95),
    }


def usage(st: AppState) -> dict[str, Any]:
    jobs = [
        {"tenant": tenant, "job": job.id, "status": job.status, **job_usage(job)}
        for job, tenant in st.store.all_jobs()
    ]
    return {
        "object": "marlaas.usage",
        "generated_at": time.time(),
        "tenants": [
            {"tenant": name, **u} for name, u in st.store.usage_by_tenant().items()
        ],
        "jobs": jobs,
    }


def admin_router() -> APIRouter:
    router = APIRouter(prefix="/v1/admin")

    @router.get("/overview")
    async def get_overview(request: Request):
        st = state(request)
        require_admin(st.cfg.admin_key_path, request)
        return await run_in_threadpool(overview, st)

    @router.get("/usage")
    async def get_usage(request: Request):
        st = state(request)
        require_admin(st.cfg.admin_key_path, request)
        return await run_in_threadpool(usage, st)

    return router
