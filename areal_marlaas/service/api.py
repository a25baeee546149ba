"""The service's HTTP API: OpenAI's files, fine-tuning jobs, evals and models
endpoints under ``/v1`` (the official ``openai`` SDK is the reference client), an
inference proxy, the operator's ``/v1/admin/overview``, the ``/dashboard`` page,
``/metrics`` and ``/health``.

The API inserts requests (files, jobs, cancel/pause/resume actions) and reads;
which process writes what is in ``areal_marlaas.service.store``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import asynccontextmanager

import httpx
from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response

from areal_marlaas.config.service import ServiceConfig
from areal_marlaas.graders import GradingContext
from areal_marlaas.service.auth import require_admin
from areal_marlaas.service.dashboard import dashboard_router
from areal_marlaas.service.deps import AppState, state
from areal_marlaas.service.errors import (
    NO_RETRY,
    APIError,
    error_response,
    install_error_handlers,
)
from areal_marlaas.service.grading import service_grader_validator
from areal_marlaas.service.prometheus import ServiceMetrics
from areal_marlaas.service.router import ModelRouter
from areal_marlaas.service.routes_admin import admin_router
from areal_marlaas.service.routes_evals import evals_router
from areal_marlaas.service.routes_files import MULTIPART_OVERHEAD, files_router
from areal_marlaas.service.routes_graders import graders_router
from areal_marlaas.service.routes_jobs import jobs_router
from areal_marlaas.service.routes_models import models_router
from areal_marlaas.service.store import JobStore

# Generation on a busy CPU server takes minutes; connecting should not.
UPSTREAM_TIMEOUT = httpx.Timeout(600.0, connect=10.0)


def create_app(
    cfg: ServiceConfig,
    store: JobStore,
    router: ModelRouter | None = None,
    grader_validator: Callable[[dict], None] | None = None,
    metrics: ServiceMetrics | None = None,
    grading: GradingContext | None = None,
    tokenizer=None,
) -> FastAPI:
    """The API app. ``router`` enables the inference proxy (None: 503);
    ``grader_validator`` checks a job's grader (default: the graders module with
    ``grading`` and the ``service.grader_kinds`` marlaas kinds); pass the
    ``metrics`` object the scheduler also reports to (default: a new one);
    ``tokenizer`` counts a supervised job's demonstration tokens at creation."""
    grading = grading or GradingContext()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.http = httpx.AsyncClient(timeout=UPSTREAM_TIMEOUT)
        try:
            yield
        finally:
            await app.state.http.aclose()

    app = FastAPI(
        title="MARLaaS",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.marlaas = AppState(
        cfg=cfg,
        store=store,
        router=router,
        grader_validator=grader_validator
        or service_grader_validator(cfg.grader_kinds, grading),
        metrics=metrics or ServiceMetrics(store),
        grading=grading,
        tokenizer=tokenizer,
    )
    app.state.started = time.time()
    install_error_handlers(app)
    app.include_router(files_router(cfg))
    app.include_router(jobs_router())
    app.include_router(models_router())
    app.include_router(graders_router())
    app.include_router(evals_router())
    app.include_router(admin_router())
    app.include_router(dashboard_router())

    @app.get("/health")
    def health():
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics_endpoint(request: Request):
        st = state(request)
        if not st.cfg.metrics_public:
            require_admin(st.cfg.admin_key_path, request)
        body = await run_in_threadpool(st.metrics.render)
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    app.add_middleware(
        _BodyLimit,
        default=cfg.max_request_bytes,
        upload=cfg.max_file_bytes + MULTIPART_OVERHEAD,
    )
    app.add_middleware(_CountRequests, metrics=app.state.marlaas.metrics)
    return app


class _BodyLimit:
    """413 in OpenAI's envelope for a request body over the limit: uploads get
    max_file_bytes (+ multipart framing), everything else max_request_bytes.
    (FastAPI's own ``max_body_size`` answers in plain text.) A declared
    Content-Length is refused before reading; a chunked body when it crosses the
    limit, while the route reads it."""

    def __init__(self, app, default: int, upload: int):
        self.app, self.default, self.upload = app, default, upload

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        upload = scope["method"] == "POST" and scope["path"].rstrip("/") == "/v1/files"
        limit = self.upload if upload else self.default
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            return await error_response(_too_large(limit))(scope, receive, send)
        seen = 0

        async def limited():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise _too_large(limit)
            return message

        await self.app(scope, limited, send)


def _too_large(limit: int) -> APIError:
    return APIError(
        413,
        f"The request body is larger than {limit} bytes.",
        code="request_too_large",
        headers=NO_RETRY,
    )


class _CountRequests:
    """ASGI middleware counting responses by method, route template and status
    (the template, not the URL: ids would explode the label space)."""

    def __init__(self, app, metrics: ServiceMetrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = 500

        async def send_and_watch(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_watch)
        finally:
            route = scope.get("route")
            path = getattr(route, "path", None) or "unmatched"
            self.metrics.observe_request(scope["method"], path, status)
