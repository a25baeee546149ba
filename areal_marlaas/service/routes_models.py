"""``/v1/models`` and the inference proxy (``/v1/chat/completions``,
``/v1/completions``) to the shared multi-LoRA vLLM server.

The tenant's ``model`` goes through the :class:`ModelRouter` (a model the tenant
may not use is a 404, like a missing one); responses, streamed or not, come back
with ``model`` rewritten to the tenant's name, so upstream names never show.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import httpx
from areal.utils import logging
from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, StreamingResponse

from areal_marlaas.service.deps import state, tenant_of
from areal_marlaas.service.errors import NO_RETRY, APIError, bad_request
from areal_marlaas.service.objects import model_object
from areal_marlaas.service.router import (
    ModelNotFound,
    ModelRouter,
    Route,
    UpstreamError,
)
from areal_marlaas.service.tables import Tenant
from areal_marlaas.service.validation import parse_json_object

logger = logging.getLogger("MARLaaSService")

BASE_OWNER = "marlaas"


def _no_model(model: str) -> APIError:
    return APIError(
        404,
        f"The model `{model}` does not exist or you do not have access to it.",
        param="model",
        code="model_not_found",
    )


def models_router() -> APIRouter:
    router = APIRouter(prefix="/v1")

    @router.get("/models")
    def list_models(request: Request, tenant: Tenant = Depends(tenant_of)):
        st = state(request)
        data = [model_object(st.cfg.base_model, request.app.state.started, BASE_OWNER)]
        data += [
            model_object(n, t, tenant.id) for n, t in st.store.models_of(tenant.id)
        ]
        return {"object": "list", "data": data}

    @router.get("/models/{model_id:path}")
    def retrieve_model(
        request: Request, model_id: str, tenant: Tenant = Depends(tenant_of)
    ):
        st = state(request)
        if model_id == st.cfg.base_model:
            return model_object(model_id, request.app.state.started, BASE_OWNER)
        for name, created in st.store.models_of(tenant.id):
            if name == model_id:
                return model_object(name, created, tenant.id)
        raise _no_model(model_id)

    @router.post("/chat/completions")
    async def chat_completions(request: Request, tenant: Tenant = Depends(tenant_of)):
        return await _proxy(request, tenant, "chat/completions")

    @router.post("/completions")
    async def completions(request: Request, tenant: Tenant = Depends(tenant_of)):
        return await _proxy(request, tenant, "completions")

    return router


async def _proxy(request: Request, tenant: Tenant, endpoint: str):
    st = state(request)
    if st.router is None:
        raise APIError(
            503,
            "Inference is not enabled on this service.",
            type="server_error",
            headers=NO_RETRY,
        )
    body = parse_json_object(await request.body())
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("model is required.", "model")
    client: httpx.AsyncClient = request.app.state.http
    for attempt in (1, 2):
        route = await _resolve(st.router, tenant, model)
        release = _Release(st.router, route)
        try:
            upstream = await client.send(
                client.build_request(
                    "POST",
                    f"{route.base_url}/{endpoint}",
                    json={**body, "model": route.model},
                ),
                stream=True,
            )
        except httpx.HTTPError as e:
            await release()
            logger.error(f"upstream {route.base_url}: {e!r}")
            raise APIError(
                502, "The model server is unreachable.", type="server_error"
            ) from e
        # A restarted server has forgotten the adapters loaded for chat: drop the
        # stale entry and load it again, once.
        forget = getattr(st.router, "forget", None)
        if (
            upstream.status_code == 404
            and attempt == 1
            and forget is not None
            and await run_in_threadpool(forget, route)
        ):
            await upstream.aclose()
            await release()
            continue
        break
    else:  # the second attempt always breaks
        raise AssertionError("unreachable")
    if body.get("stream") is not True or upstream.status_code != 200:
        try:
            raw = await upstream.aread()
        finally:
            await upstream.aclose()
            await release()
        return _json_reply(raw, upstream.status_code, route, model)

    async def events():
        try:
            async for line in upstream.aiter_lines():
                yield _sse_line(line, model) + "\n"
        finally:
            # Also on a client disconnect (cancellation): release must still run.
            with anyio.CancelScope(shield=True):
                await upstream.aclose()
                await release()

    return StreamingResponse(
        events(),
        media_type="text/event-stream",
        headers={"cache-control": "no-cache"},
    )


async def _resolve(router: ModelRouter, tenant: Tenant, model: str) -> Route:
    try:
        return await run_in_threadpool(router.resolve, tenant.id, model)
    except ModelNotFound as e:
        raise _no_model(model) from e
    except UpstreamError as e:
        logger.error(f"resolve {model}: {e}")
        raise APIError(
            502, "The model server could not load this model.", type="server_error"
        ) from e


class _Release:
    """Release a route once (blocking router calls run off the event loop)."""

    def __init__(self, router: ModelRouter, route: Route):
        self.router, self.route, self.done = router, route, False

    async def __call__(self) -> None:
        if not self.done:
            self.done = True
            await run_in_threadpool(self.router.release, self.route)


def _json_reply(raw: bytes, status: int, route: Route, model: str) -> JSONResponse:
    try:
        obj: Any = json.loads(raw)
    except ValueError:
        obj = None
    if status >= 400:
        return JSONResponse(
            status_code=status, content=_upstream_error(obj, route, model)
        )
    if not isinstance(obj, dict):
        raise APIError(
            502, "The model server sent an invalid reply.", type="server_error"
        )
    if "model" in obj:
        obj["model"] = model
    return JSONResponse(status_code=status, content=obj)


def _upstream_error(obj: Any, route: Route, model: str) -> dict[str, Any]:
    """vLLM's error, in OpenAI's envelope, without upstream model names."""
    err = obj.get("error", obj) if isinstance(obj, dict) else {}
    if not isinstance(err, dict):
        err = {"message": str(err)}
    message = str(err.get("message") or "The model server returned an error.")
    code = err.get("code")
    return {
        "error": {
            "message": message.replace(route.model, model),
            "type": err.get("type") or "invalid_request_error",
            "param": err.get("param"),
            "code": code if isinstance(code, str) else None,
        }
    }


def _sse_line(line: str, model: str) -> str:
    if not line.startswith("data:"):
        return line
    payload = line[5:].strip()
    if not payload or payload == "[DONE]":
        return line
    try:
        obj = json.loads(payload)
    except ValueError:
        return line
    if isinstance(obj, dict) and "model" in obj:
        obj["model"] = model
    return "data: " + json.dumps(obj, separators=(",", ":"))
