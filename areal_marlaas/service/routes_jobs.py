"""``/v1/fine_tuning/jobs``: create (idempotent), list, retrieve, cancel/pause/
resume requests, events and checkpoints."""

from __future__ import annotations

import re
import time

from fastapi import APIRouter, Depends, Query, Request
from fastapi.concurrency import run_in_threadpool

from areal_marlaas.service.deps import AppState, state, tenant_of
from areal_marlaas.service.errors import bad_request
from areal_marlaas.service.jobs import JobFileError, check_example_lines
from areal_marlaas.service.objects import (
    checkpoint_object,
    event_object,
    job_object,
    list_object,
)
from areal_marlaas.service.routes_files import check_limit
from areal_marlaas.service.store import JobStore, NewJob, NotFound
from areal_marlaas.service.tables import Checkpoint, File, Job, Tenant
from areal_marlaas.service.validation import (
    JobType,
    method_object,
    parse_job_request,
    parse_json_object,
    resolve_hyperparameters,
)

LIST_MAX = 100
METADATA_QUERY = re.compile(r"^metadata\[(.+)\]$")
IDEMPOTENCY_KEY_MAX = 255
# The SDK's default timeout (600 s) plus its retry backoff, with margin.
RETRY_WINDOW_S = 900.0


def _job_json(store: JobStore, job: Job) -> dict:
    pending = store.pending_actions_of([job.id]).get(job.id)
    return job_object(job, pending)


def jobs_router() -> APIRouter:
    router = APIRouter(prefix="/v1")

    @router.post("/fine_tuning/jobs")
    async def create_job(request: Request, tenant: Tenant = Depends(tenant_of)):
        st = state(request)
        body = parse_json_object(await request.body())
        key = request.headers.get("idempotency-key")
        if key is not None and not 0 < len(key) <= IDEMPOTENCY_KEY_MAX:
            raise bad_request(
                f"Idempotency-Key must be 1 to {IDEMPOTENCY_KEY_MAX} characters.",
                "Idempotency-Key",
            )
        retry = request.headers.get("x-stainless-retry-count", "0") not in ("", "0")

        def create() -> dict:
            # Off the event loop: the grader validator may be slow (the graders
            # module compiles tenant code), the store is blocking I/O.
            req = parse_job_request(
                body, st.cfg, st.grader_validator, st.cfg.egress.policy(tenant.name)
            )
            if key is None and retry:
                # The official SDK retries a create (timeouts, 5xx) without an
                # Idempotency-Key; a retry whose first attempt did create the job
                # gets that job instead of a duplicate.
                since = time.time() - RETRY_WINDOW_S
                earlier = st.store.recent_duplicate(
                    tenant.id, req.request_sha256, since
                )
                if earlier is not None:
                    return _job_json(st.store, earlier)
            start = _start_checkpoint(st, tenant.id, req.model)
            train = _fine_tune_file(
                st.store, tenant.id, req.training_file, "training_file"
            )
            files = [(train, "training_file")]
            if req.validation_file is not None:
                valid = _fine_tune_file(
                    st.store, tenant.id, req.validation_file, "validation_file"
                )
                files.append((valid, "validation_file"))
            if req.type is not JobType.REINFORCEMENT:
                for f, param in files:  # examples: checked here, a 400
                    _check_examples(st, req.type, f, param)
            resolved, steps = resolve_hyperparameters(
                req.hyperparameters, st.cfg, train.lines, req.type
            )
            new = NewJob(
                model=req.model,
                training_file=req.training_file,
                validation_file=req.validation_file,
                method=method_object(
                    req.grader, resolved, req.tools, req.max_episode_steps, req.type
                ),
                hyperparameters=resolved,
                metadata=req.metadata,
                seed=req.seed,
                suffix=req.suffix,
                steps_total=steps,
                request_sha256=req.request_sha256,
            )
            job, _created = st.store.create_job(
                tenant.id,
                new,
                idempotency_key=key,
                max_queued=st.cfg.max_queued_jobs,
            )
            if start is not None:  # its own copy: retention never takes it
                st.store.keep_start_adapter(job.id, start)
            return _job_json(st.store, job)

        return await run_in_threadpool(create)

    @router.get("/fine_tuning/jobs")
    def list_jobs(
        request: Request,
        after: str | None = None,
        limit: int = Query(20),
        tenant: Tenant = Depends(tenant_of),
    ):
        check_limit(limit, LIST_MAX)
        metadata, null = _metadata_filter(request)
        store = state(request).store
        page = store.list_jobs(
            tenant.id, after=after, limit=limit, metadata=metadata, metadata_null=null
        )
        pending = store.pending_actions_of([j.id for j in page.items])
        data = [job_object(j, pending.get(j.id)) for j in page.items]
        return list_object(data, page.has_more)

    @router.get("/fine_tuning/jobs/{job_id}")
    def retrieve_job(
        request: Request, job_id: str, tenant: Tenant = Depends(tenant_of)
    ):
        store = state(request).store
        return _job_json(store, store.get_job(tenant.id, job_id))

    def action_route(action: str):
        def handler(request: Request, job_id: str, tenant: Tenant = Depends(tenant_of)):
            store = state(request).store
            store.request_action(tenant.id, job_id, action)
            return _job_json(store, store.get_job(tenant.id, job_id))

        handler.__name__ = f"{action}_job"
        router.add_api_route(
            f"/fine_tuning/jobs/{{job_id}}/{action}", handler, methods=["POST"]
        )

    for action in ("cancel", "pause", "resume"):
        action_route(action)

    @router.get("/fine_tuning/jobs/{job_id}/events")
    def list_events(
        request: Request,
        job_id: str,
        after: str | None = None,
        limit: int = Query(20),
        tenant: Tenant = Depends(tenant_of),
    ):
        check_limit(limit, LIST_MAX)
        page = state(request).store.list_events(
            tenant.id, job_id, after=after, limit=limit
        )
        return list_object([event_object(e) for e in page.items], page.has_more)

    @router.get("/fine_tuning/jobs/{job_id}/checkpoints")
    def list_checkpoints(
        request: Request,
        job_id: str,
        after: str | None = None,
        limit: int = Query(10),
        tenant: Tenant = Depends(tenant_of),
    ):
        check_limit(limit, LIST_MAX)
        page = state(request).store.list_checkpoints(
            tenant.id, job_id, after=after, limit=limit
        )
        return list_object([checkpoint_object(c) for c in page.items], page.has_more)

    return router


def _fine_tune_file(store: JobStore, tenant_id: str, file_id: str, param: str) -> File:
    f = store.get_file(tenant_id, file_id, param=param)
    if f.purpose != "fine-tune":
        raise bad_request(
            f"File {file_id} has purpose '{f.purpose}'; {param} needs a 'fine-tune' "
            "file.",
            param,
        )
    return f


def _start_checkpoint(st: AppState, tenant_id: str, model: str) -> Checkpoint | None:
    """The checkpoint a job continues (``model`` is the tenant's ``ft:`` model
    or checkpoint), None for the base model; another tenant's is a 404."""
    if model == st.cfg.base_model:
        return None
    ckpt = st.store.checkpoint_for_model(tenant_id, model)
    if ckpt is None:
        raise NotFound("model", model, param="model")
    return ckpt


def _check_examples(st: AppState, kind: JobType, f: File, param: str) -> None:
    try:
        check_example_lines(
            kind.train_method,
            st.store.file_path(f),
            st.tokenizer,
            st.cfg.supervised_max_tokens,
            param,
        )
    except JobFileError as e:
        raise bad_request(str(e), e.param) from None


def _metadata_filter(request: Request) -> tuple[dict[str, str] | None, bool]:
    """``metadata[k]=v`` pairs (the SDK's deep-object form) or ``metadata=null``."""
    pairs: dict[str, str] = {}
    null = False
    for k, v in request.query_params.multi_items():
        if k == "metadata":
            if v != "null":
                raise bad_request(
                    "Filter by metadata with metadata[key]=value, or metadata=null.",
                    "metadata",
                )
            null = True
            continue
        m = METADATA_QUERY.match(k)
        if m:
            pairs[m.group(1)] = v
    if null and pairs:
        raise bad_request(
            "metadata=null cannot be combined with metadata[key]=value.", "metadata"
        )
    return pairs or None, null
