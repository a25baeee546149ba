"""A job's validation runs, as the SDK's ``client.evals`` reads them: one eval per
job with a validation file, one run per evaluated step, one output item per
validation row. The scheduler writes them (``record_eval_run``); the API reads
them, each tenant its own only."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import select

from areal_marlaas.service.store.base import NotFound, Page, StoreBase
from areal_marlaas.service.tables import (
    EvalOutputItem,
    EvalRecord,
    EvalRun,
    Job,
    new_id,
)

ORDERS = ("asc", "desc")


class EvalStore(StoreBase):
    # -- the scheduler's writes ----------------------------------------------------
    def ensure_eval(self, job_id: str, testing_criteria: list[dict[str, Any]]) -> str:
        """The job's eval id, made on first call (the job then names it)."""
        with self._write() as s:
            job = s.scalar(select(Job).where(Job.id == job_id))
            if job is None:
                raise NotFound("job", job_id)
            if job.eval_id is not None:
                return job.eval_id
            ev = EvalRecord(
                id=new_id("eval"),
                tenant_id=job.tenant_id,
                job_id=job_id,
                name=f"{job_id} validation",
                testing_criteria=testing_criteria,
                created_at=time.time(),
            )
            s.add(ev)
            s.flush()
            job.eval_id = ev.id
            return ev.id

    def record_eval_run(
        self,
        eval_id: str,
        step: int,
        model: str,
        status: str,
        result: dict[str, Any],
        items: list[tuple[int, str, dict[str, Any]]],
        eval_tokens: int = 0,
    ) -> EvalRun:
        """A run and its output items ``(row index, status, body)``, in one
        transaction: a run is never seen without its items. ``eval_tokens``
        (generated) are added to its job's usage in the same transaction."""
        now = time.time()
        with self._write() as s:
            ev = s.scalar(select(EvalRecord).where(EvalRecord.id == eval_id))
            if ev is None:
                raise NotFound("eval", eval_id)
            run = EvalRun(
                id=new_id("evalrun"),
                eval_id=eval_id,
                tenant_id=ev.tenant_id,
                step=step,
                model=model,
                status=status,
                result=result,
                created_at=now,
            )
            s.add(run)
            job = s.scalar(select(Job).where(Job.id == ev.job_id))
            if job is not None:
                job.eval_tokens = (job.eval_tokens or 0) + int(eval_tokens)
            s.flush()  # the items' foreign key needs the run's row first
            for index, item_status, body in items:
                s.add(
                    EvalOutputItem(
                        id=new_id("outputitem"),
                        run_id=run.id,
                        eval_id=eval_id,
                        tenant_id=ev.tenant_id,
                        datasource_item_id=index,
                        status=item_status,
                        body=body,
                        created_at=now,
                    )
                )
            return run

    # -- the API's reads (tenant-scoped) ------------------------------------------
    def get_eval(self, tenant_id: str, eval_id: str) -> EvalRecord:
        with self._read() as s:
            ev = s.scalar(
                select(EvalRecord).where(
                    EvalRecord.id == eval_id, EvalRecord.tenant_id == tenant_id
                )
            )
        if ev is None:
            raise NotFound("eval", eval_id, param="eval_id")
        return ev

    def list_evals(
        self,
        tenant_id: str,
        *,
        after: str | None = None,
        limit: int = 20,
        order: str = "asc",
    ) -> Page[EvalRecord]:
        with self._read() as s:
            q = select(EvalRecord).where(EvalRecord.tenant_id == tenant_id)
            return self._ordered(s, q, EvalRecord, tenant_id, after, limit, order)

    def list_eval_runs(
        self,
        tenant_id: str,
        eval_id: str,
        *,
        after: str | None = None,
        limit: int = 20,
        order: str = "asc",
        status: str | None = None,
    ) -> Page[EvalRun]:
        self.get_eval(tenant_id, eval_id)
        with self._read() as s:
            q = select(EvalRun).where(EvalRun.eval_id == eval_id)
            if status is not None:
                q = q.where(EvalRun.status == status)
            return self._ordered(s, q, EvalRun, tenant_id, after, limit, order)

    def get_eval_run(self, tenant_id: str, eval_id: str, run_id: str) -> EvalRun:
        self.get_eval(tenant_id, eval_id)
        with self._read() as s:
            run = s.scalar(
                select(EvalRun).where(EvalRun.id == run_id, EvalRun.eval_id == eval_id)
            )
        if run is None:
            raise NotFound("eval run", run_id, param="run_id")
        return run

    def list_output_items(
        self,
        tenant_id: str,
        eval_id: str,
        run_id: str,
        *,
        after: str | None = None,
        limit: int = 20,
        order: str = "asc",
        status: str | None = None,
    ) -> Page[EvalOutputItem]:
        self.get_eval_run(tenant_id, eval_id, run_id)
        with self._read() as s:
            q = select(EvalOutputItem).where(EvalOutputItem.run_id == run_id)
            if status is not None:
                q = q.where(EvalOutputItem.status == status)
            return self._ordered(s, q, EvalOutputItem, tenant_id, after, limit, order)

    def get_output_item(
        self, tenant_id: str, eval_id: str, run_id: str, item_id: str
    ) -> EvalOutputItem:
        self.get_eval_run(tenant_id, eval_id, run_id)
        with self._read() as s:
            item = s.scalar(
                select(EvalOutputItem).where(
                    EvalOutputItem.id == item_id, EvalOutputItem.run_id == run_id
                )
            )
        if item is None:
            raise NotFound("output item", item_id, param="output_item_id")
        return item

    def _ordered(self, s, q, model, tenant_id, after, limit, order) -> Page:
        if order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
        if after is not None:
            seq = self._cursor_seq(s, model, tenant_id, after, model.__tablename__)
            q = q.where(model.seq > seq if order == "asc" else model.seq < seq)
        key = model.seq.asc() if order == "asc" else model.seq.desc()
        return self._page(s, q.order_by(key), limit)
