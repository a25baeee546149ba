"""``/v1/evals``: a tenant's validation runs, read-only, in the shape of the SDK's
``client.evals`` (retrieve and list evals, runs and output items). Evals are made
by the service for jobs with a validation file; creating, updating or deleting
one through the API is not offered (405)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query, Request

from areal_marlaas.service.deps import state, tenant_of
from areal_marlaas.service.errors import bad_request
from areal_marlaas.service.objects import (
    eval_object,
    eval_run_object,
    list_object,
    output_item_object,
)
from areal_marlaas.service.routes_files import check_limit
from areal_marlaas.service.store import JobStore
from areal_marlaas.service.store.evals import ORDERS
from areal_marlaas.service.tables import Tenant

LIST_MAX = 100
RUN_STATUSES = ("completed", "failed")
ITEM_STATUSES = ("pass", "fail", "error")


def _check(order: str, status: str | None, statuses: tuple[str, ...]) -> None:
    if order not in ORDERS:
        raise bad_request(f"order must be one of {', '.join(ORDERS)}.", "order")
    if status is not None and status not in statuses:
        raise bad_request(f"status must be one of {', '.join(statuses)}.", "status")


def _validation_file(store: JobStore, tenant_id: str, eval_id: str) -> str | None:
    """The file an eval's runs read (404 for another tenant's eval)."""
    ev = store.get_eval(tenant_id, eval_id)
    return store.get_job(tenant_id, ev.job_id).validation_file


def evals_router() -> APIRouter:
    router = APIRouter(prefix="/v1")

    @router.get("/evals")
    def list_evals(
        request: Request,
        after: str | None = None,
        limit: int = Query(20),
        order: str = "asc",
        tenant: Tenant = Depends(tenant_of),
    ):
        check_limit(limit, LIST_MAX)
        _check(order, None, ())
        page = state(request).store.list_evals(
            tenant.id, after=after, limit=limit, order=order
        )
        return list_object([eval_object(e) for e in page.items], page.has_more)

    @router.get("/evals/{eval_id}")
    def retrieve_eval(request: Request, eval_id: str, tenant=Depends(tenant_of)):
        return eval_object(state(request).store.get_eval(tenant.id, eval_id))

    @router.get("/evals/{eval_id}/runs")
    def list_runs(
        request: Request,
        eval_id: str,
        after: str | None = None,
        limit: int = Query(20),
        order: str = "asc",
        status: str | None = None,
        tenant: Tenant = Depends(tenant_of),
    ):
        check_limit(limit, LIST_MAX)
        _check(order, status, RUN_STATUSES)
        store = state(request).store
        valid = _validation_file(store, tenant.id, eval_id)
        page = store.list_eval_runs(
            tenant.id, eval_id, after=after, limit=limit, order=order, status=status
        )
        runs = [eval_run_object(r, valid) for r in page.items]
        return list_object(runs, page.has_more)

    @router.get("/evals/{eval_id}/runs/{run_id}")
    def retrieve_run(
        request: Request, eval_id: str, run_id: str, tenant=Depends(tenant_of)
    ):
        store = state(request).store
        valid = _validation_file(store, tenant.id, eval_id)
        return eval_run_object(store.get_eval_run(tenant.id, eval_id, run_id), valid)

    @router.get("/evals/{eval_id}/runs/{run_id}/output_items")
    def list_output_items(
        request: Request,
        eval_id: str,
        run_id: str,
        after: str | None = None,
        limit: int = Query(20),
        order: str = "asc",
        status: str | None = None,
        tenant: Tenant = Depends(tenant_of),
    ):
        check_limit(limit, LIST_MAX)
        _check(order, status, ITEM_STATUSES)
        page = state(request).store.list_output_items(
            tenant.id,
            eval_id,
            run_id,
            after=after,
            limit=limit,
            order=order,
            status=status,
        )
        return list_object([output_item_object(i) for i in page.items], page.has_more)

    @router.get("/evals/{eval_id}/runs/{run_id}/output_items/{item_id}")
    def retrieve_output_item(
        request: Request,
        eval_id: str,
        run_id: str,
        item_id: str,
        tenant: Tenant = Depends(tenant_of),
    ):
        item = state(request).store.get_output_item(tenant.id, eval_id, run_id, item_id)
        return output_item_object(item)

    return router
