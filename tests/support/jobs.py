"""Job-store rows in the states the webhook and runner tests start from."""

from __future__ import annotations

from areal_marlaas.service.store import JobStore, NewJob
from areal_marlaas.service.tables import Job


def new_tenant(store: JobStore, name: str) -> str:
    tenant, _ = store.create_tenant(name)
    return tenant.id


def running_job(store: JobStore, tenant_id: str) -> Job:
    f = store.add_file(tenant_id, "t.jsonl", "fine-tune", b"{}\n", 1)
    job, _ = store.create_job(
        tenant_id, NewJob("m", f.id, None, {}, {}, None, 0, None, steps_total=2)
    )
    store.set_status(job.id, "queued")
    return store.set_status(job.id, "running")
