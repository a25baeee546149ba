"""``/v1/fine_tuning/alpha/graders/validate`` and ``/run``: a tenant tries a grader
before paying for a job (``client.fine_tuning.alpha.graders.validate/run``)."""

from __future__ import annotations

import dataclasses
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool

from areal_marlaas.agents.egress import EgressError
from areal_marlaas.graders import (
    GraderError,
    GradingContext,
    build_sample,
    public_grader,
    run_grader,
    validate_grader,
    validate_response,
)
from areal_marlaas.service.deps import state, tenant_of
from areal_marlaas.service.errors import bad_request
from areal_marlaas.service.tables import Tenant
from areal_marlaas.service.validation import endpoint_urls, parse_json_object


def _grader(body: dict[str, Any], st, tenant: Tenant) -> Any:
    spec = body.get("grader")
    if not isinstance(spec, dict):
        raise bad_request("grader is required: an object with a type.", "grader")
    policy = st.cfg.egress.policy(tenant.name)
    for url, param in endpoint_urls(spec, "grader"):
        try:
            policy.check(url, param)
        except EgressError as e:
            raise bad_request(str(e), param=e.param) from None
    try:
        st.grader_validator(spec)  # this service's rules (kinds, sandbox, judge)
        return validate_grader(spec, st.grading, param="grader")
    except GraderError as e:
        raise bad_request(f"Invalid grader: {e}", param=e.param or "grader") from e


def _sample(value: Any) -> dict:
    """The SDK sends model_sample as a string (or an object with output_text)."""
    if isinstance(value, str):
        return build_sample(value)
    if isinstance(value, dict) and isinstance(value.get("output_text"), str):
        return {**build_sample(value["output_text"]), **value}
    raise bad_request(
        "model_sample is required: the model's output text to grade.", "model_sample"
    )


def graders_router() -> APIRouter:
    router = APIRouter(prefix="/v1/fine_tuning/alpha/graders")

    @router.post("/validate")
    async def validate(request: Request, tenant: Tenant = Depends(tenant_of)):
        st = state(request)
        body = parse_json_object(await request.body())
        unknown = sorted(set(body) - {"grader"})
        if unknown:
            raise bad_request(f"Unrecognized argument(s): {unknown}.", unknown[0])
        grader = await run_in_threadpool(_grader, body, st, tenant)
        return {"grader": public_grader(validate_response(grader)["grader"])}

    @router.post("/run")
    async def run(request: Request, tenant: Tenant = Depends(tenant_of)):
        st = state(request)
        body = parse_json_object(await request.body())
        unknown = sorted(set(body) - {"grader", "model_sample", "item"})
        if unknown:
            raise bad_request(f"Unrecognized argument(s): {unknown}.", unknown[0])
        grader = await run_in_threadpool(_grader, body, st, tenant)
        item = body.get("item") or {}
        if not isinstance(item, dict):
            raise bad_request("item must be an object (the dataset row).", "item")
        # The tenant's egress policy again at connect time (endpoint graders).
        policy = st.cfg.egress.policy(tenant.name)
        ctx = dataclasses.replace(st.grading, egress=policy.to_dict())
        result = await run_grader(grader, _sample(body.get("model_sample")), item, ctx)
        return result.to_dict()

    return router


__all__ = ["GradingContext", "graders_router"]
