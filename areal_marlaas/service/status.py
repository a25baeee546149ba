"""``marlaas service status``: every tenant's jobs with their progress."""

from __future__ import annotations

import time

from areal_marlaas.service.objects import job_usage
from areal_marlaas.service.store import JobStore


def status_rows(store: JobStore) -> list[dict]:
    """One dict per job, oldest first (also what a JSON status would print)."""
    rows = []
    for job, tenant in store.all_jobs():
        rows.append(
            {
                "tenant": tenant,
                "job": job.id,
                "task": job.task_name,
                "status": job.status,
                "steps_done": job.steps_done,
                "steps_total": job.steps_total,
                "ttfs_s": job.ttfs_s,
                "created_at": job.created_at,
                "fine_tuned_model": job.fine_tuned_model,
                **job_usage(job),
            }
        )
    return rows


def format_status(store: JobStore, now: float | None = None) -> str:
    now = time.time() if now is None else now
    tenants = store.list_tenants()
    rows = status_rows(store)
    lines = [f"{len(tenants)} tenant(s), {len(rows)} job(s)"]
    if not rows:
        return lines[0]
    header = ("tenant", "job", "status", "steps", "ttfs", "trainer", "tokens", "age")
    table: list[tuple[str, ...]] = [header]
    for r in rows:
        ttfs = "-" if r["ttfs_s"] is None else f"{r['ttfs_s']:.1f}s"
        table.append(
            (
                r["tenant"],
                r["job"],
                r["status"],
                f"{r['steps_done']}/{r['steps_total']}",
                ttfs,
                f"{r['trainer_s']:.1f}s",
                str(r["generated_tokens"] + r["eval_tokens"]),
                _age(now - r["created_at"]),
            )
        )
    widths = [max(len(str(row[i])) for row in table) for i in range(len(header))]
    for row in table:
        lines.append(
            "  ".join(
                str(c).ljust(w) for c, w in zip(row, widths, strict=True)
            ).rstrip()
        )
    usage = store.usage_by_tenant()
    lines.append(
        "usage per tenant (trainer-seconds, generated / trained / eval tokens):"
    )
    for name, u in usage.items():
        lines.append(
            f"  {name}: {u['trainer_s']:.1f}s, {u['generated_tokens']} / "
            f"{u['trained_tokens']} / {u['eval_tokens']}"
        )
    return "\n".join(lines)


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"
