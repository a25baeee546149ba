"""The ``endpoint`` grader: a tenant's own reward service.

``{"type": "endpoint", "name", "url", "headers", "rate_limit", "pass_threshold"}``
(OpenAI's Agent RFT shape). Each sample is POSTed as ``{"sample", "item",
"trace_id"}`` and the service answers ``{"score": <number>}``. A reply that is
not that, a 5xx, a timeout or a failed connection is retried 3 times; then the
grader raises ``EndpointDown``, which marks the sample
``unresponsive_reward_error`` and makes the workflows discard the rollout: an
endpoint that is down never turns into silent zero rewards. ``rate_limit``
(requests per second) is honored per process. ``trace_id`` is the rollout's
(the one its tool calls carried) when a workflow sets ``TRACE_ID``.

``headers`` are the tenant's secrets: never in an error message, a log line or
an API response (``public_grader`` redacts them).
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import math
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

from areal_marlaas.agents.egress import EgressError, EgressPolicy, split_url
from areal_marlaas.agents.protocol import ToolSpecError, check_headers, redacted
from areal_marlaas.agents.tool_client import MAX_PAYLOAD_BYTES, post_pinned
from areal_marlaas.graders.errors import GraderError
from areal_marlaas.graders.spec import register_grader_type

ENDPOINT = "endpoint"
RETRIES = 3
FIELDS = ("name", "url", "headers", "rate_limit", "pass_threshold")

# The rollout whose sample is being graded (its tool calls' trace_id).
TRACE_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "marlaas_trace_id", default=None
)


class EndpointDown(RuntimeError):
    """The grader endpoint failed every try: the rollout is discarded."""

    grader_flag = "unresponsive_reward_error"


@dataclass(frozen=True)
class EndpointConfig:
    name: str
    url: str
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    rate_limit: float | None = None
    pass_threshold: float | None = None


def _number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def parse_endpoint(spec: dict, param: str) -> EndpointConfig:
    extra = sorted(set(spec) - {"type", *FIELDS})
    if extra:
        raise GraderError(
            f"{param}.{extra[0]}: unknown field for an endpoint grader; allowed "
            f"fields: type, {', '.join(FIELDS)}",
            f"{param}.{extra[0]}",
        )
    name = spec.get("name")
    if not isinstance(name, str) or not name.strip():
        raise GraderError(f"{param}.name is required: a string.", f"{param}.name")
    url = spec.get("url")
    try:
        # Syntax only here; where it may connect is the service's check.
        split_url(url, f"{param}.url")
        headers = check_headers(spec.get("headers"), f"{param}.headers")
    except (EgressError, ToolSpecError) as e:
        raise GraderError(str(e), e.param) from None
    rate = spec.get("rate_limit")
    if rate is not None and not (_number(rate) and rate > 0):
        raise GraderError(
            f"{param}.rate_limit must be a positive number of requests per second.",
            f"{param}.rate_limit",
        )
    threshold = spec.get("pass_threshold")
    if threshold is not None and not _number(threshold):
        raise GraderError(
            f"{param}.pass_threshold must be a number.", f"{param}.pass_threshold"
        )
    assert isinstance(url, str)  # split_url checked it
    return EndpointConfig(
        name,
        url,
        headers,
        float(rate) if rate is not None else None,
        float(threshold) if threshold is not None else None,
    )


def public_grader(spec: dict) -> dict:
    """A grader spec as an API response may show it: every endpoint grader's
    header values (a multi grader's too) redacted."""
    out = dict(spec)
    if out.get("type") == "multi" and isinstance(out.get("graders"), dict):
        out["graders"] = {
            k: public_grader(v) if isinstance(v, dict) else v
            for k, v in out["graders"].items()
        }
    elif out.get("type") == ENDPOINT and isinstance(out.get("headers"), dict):
        out["headers"] = redacted(out["headers"])
    return out


class _RateLimit:
    """Requests per second per URL, shared by every event loop of the process."""

    def __init__(self):
        self._lock = threading.Lock()
        self._next: dict[str, float] = {}

    def delay(self, url: str, rate: float) -> float:
        with self._lock:
            now = time.monotonic()
            slot = max(now, self._next.get(url, now))
            self._next[url] = slot + 1.0 / rate
            return slot - now


_LIMITS = _RateLimit()


async def run_endpoint(cfg: EndpointConfig, sample: dict, item: dict, ctx) -> float:
    trace_id = TRACE_ID.get() or f"trace_{uuid.uuid4().hex}"
    body = json.dumps(
        {"sample": sample, "item": item, "trace_id": trace_id}, default=str
    ).encode()
    if len(body) > MAX_PAYLOAD_BYTES:
        raise ValueError(f"the grading request is over {MAX_PAYLOAD_BYTES} bytes")
    policy = EgressPolicy.from_dict(getattr(ctx, "egress", None))
    timeout = float(getattr(ctx, "endpoint_timeout_s", 600.0))
    last = ""
    async with httpx.AsyncClient(trust_env=False, timeout=timeout) as client:
        for attempt in range(RETRIES + 1):
            if cfg.rate_limit:
                await asyncio.sleep(_LIMITS.delay(cfg.url, cfg.rate_limit))
            try:
                status, raw = await asyncio.wait_for(
                    post_pinned(
                        client,
                        policy,
                        cfg.url,
                        "url",
                        cfg.headers,
                        body,
                        MAX_PAYLOAD_BYTES,
                    ),
                    timeout=timeout,
                )
            except EgressError as e:
                raise EndpointDown(f"endpoint grader {cfg.name!r}: {e}") from None
            except (httpx.HTTPError, TimeoutError) as e:
                last = type(e).__name__
            else:
                score = _score(raw) if status < 300 else None
                if score is not None:
                    return score
                last = f"HTTP {status}" if status >= 300 else "no numeric score"
            if attempt < RETRIES:
                await asyncio.sleep(0.5 * 2**attempt)
    raise EndpointDown(
        f"endpoint grader {cfg.name!r} at {_origin(cfg.url)} failed "
        f"{RETRIES + 1} times ({last})"
    )


def _score(raw: bytes | None) -> float | None:
    try:
        reply = json.loads(raw or b"")
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    score = reply.get("score") if isinstance(reply, dict) else None
    return float(score) if isinstance(score, int | float) and _number(score) else None


def _origin(url: str) -> str:
    p = urlsplit(url)
    return f"{p.scheme}://{p.hostname}{f':{p.port}' if p.port else ''}"


def endpoint_failure(grades: Sequence[Mapping], reasons: list[str]) -> str | None:
    """Why a sample must be discarded: an endpoint grader that stayed down."""
    for g in grades:
        if g.get("type") == ENDPOINT and "unresponsive_reward_error" in g.get(
            "errors", []
        ):
            why = next((r for r in reasons if "endpoint grader" in r), "")
            return why or f"endpoint grader {g.get('name')!r} did not answer"
    return None


def _run(config: EndpointConfig, sample: dict, item: dict, ctx) -> Any:
    return run_endpoint(config, sample, item, ctx)


register_grader_type(ENDPOINT, parse_endpoint, _run)
