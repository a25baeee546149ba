"""Model-backed grading over HTTP: the ``score_model`` judge and the ``cosine``
metric's embeddings, both at OpenAI-compatible endpoints named by the
GradingContext (never by the tenant).

A judge reply is accepted as a bare number (``0.7``), or a JSON object with a
numeric ``score`` (or ``result``, OpenAI's structured-output field), optionally
inside a ```json fence; the number must lie within the grader's ``range``. Any
other reply, a refusal, an HTTP error or a timeout scores 0 with the reason.
The tenant's prompt must ask for that format: nothing is added to it. The
``developer`` role is sent as ``system`` (open-weight chat templates lack it).
"""

from __future__ import annotations

import asyncio
import json
import math
import re

import httpx

from areal_marlaas.graders.context import GradingContext
from areal_marlaas.graders.result import LeafResult
from areal_marlaas.graders.spec import ScoreModelGrader

_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.S)
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_RETRY_STATUS = {408, 429, 500, 502, 503, 504}


class ReplyError(ValueError):
    pass


def parse_score(reply: str, lo: float, hi: float) -> float:
    """The score in a judge's reply; ReplyError (with the reason) otherwise."""
    text = reply.strip()
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1).strip()
    value: object = None
    if _NUMBER.fullmatch(text):
        value = float(text)
    else:
        try:
            data = json.loads(text)
        except ValueError:
            data = None
        if isinstance(data, int | float) and not isinstance(data, bool):
            value = float(data)
        elif isinstance(data, dict):
            for key in ("score", "result"):
                v = data.get(key)
                if isinstance(v, int | float) and not isinstance(v, bool):
                    value = float(v)
                    break
    if value is None:
        raise ReplyError(
            'judge reply is neither a number nor {"score": <number>}: '
            f"{reply[:200]!r}"
        )
    if not math.isfinite(value):
        raise ReplyError(f"judge score {value} is not a finite number")
    if not lo <= value <= hi:
        raise ReplyError(f"judge score {value:g} is outside range [{lo:g}, {hi:g}]")
    return value


def _headers(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


async def _post(
    client: httpx.AsyncClient,
    url: str,
    body: dict,
    key: str | None,
    timeout_s: float,
    retries: int,
) -> httpx.Response:
    """POST with retries on connection errors, 408/429 and 5xx."""
    for attempt in range(retries + 1):
        last = attempt == retries
        try:
            resp = await client.post(
                url, json=body, headers=_headers(key), timeout=timeout_s
            )
        except httpx.HTTPError:
            if last:
                raise
        else:
            if resp.status_code not in _RETRY_STATUS or last:
                return resp
        await asyncio.sleep(0.2 * 2**attempt)
    raise AssertionError("unreachable")


def chat_body(grader: ScoreModelGrader, messages: list[dict]) -> dict:
    body: dict = {"model": grader.model, "messages": messages}
    params = grader.sampling_params
    for key in ("temperature", "top_p", "seed", "reasoning_effort"):
        if params.get(key) is not None:
            body[key] = params[key]
    if params.get("max_completions_tokens") is not None:
        body["max_completion_tokens"] = params["max_completions_tokens"]
    return body


async def score_model(
    grader: ScoreModelGrader,
    messages: list[dict],
    ctx: GradingContext,
    client: httpx.AsyncClient,
) -> LeafResult:
    """Ask the judge; ``messages`` are already rendered ``{role, content}``."""
    sent = [
        {**m, "role": "system" if m["role"] == "developer" else m["role"]}
        for m in messages
    ]
    assert ctx.judge_base_url  # the grader runner checks it first
    url = ctx.judge_base_url.rstrip("/") + "/chat/completions"
    try:
        resp = await _post(
            client,
            url,
            chat_body(grader, sent),
            ctx.judge_api_key,
            ctx.judge_timeout_s,
            ctx.judge_retries,
        )
    except httpx.HTTPError as e:
        why = f"judge request failed: {type(e).__name__}: {e}"
        return LeafResult.fail(
            "model_grader_server_error", why, model_grader_server_error_details=why
        )
    if resp.status_code != 200:
        why = f"judge returned HTTP {resp.status_code}: {resp.text[:300]}"
        return LeafResult.fail(
            "model_grader_server_error", why, model_grader_server_error_details=why
        )
    try:
        data = resp.json()
        message = data["choices"][0]["message"]
    except (ValueError, KeyError, IndexError, TypeError):
        why = f"judge reply is not a chat completion: {resp.text[:300]}"
        return LeafResult.fail(
            "model_grader_server_error", why, model_grader_server_error_details=why
        )
    usage = data.get("usage") if isinstance(data.get("usage"), dict) else None
    tokens = None
    if usage:
        tokens = {
            k: int(usage.get(k) or 0)
            for k in ("prompt_tokens", "completion_tokens", "total_tokens")
        }
    model_name = data.get("model") if isinstance(data.get("model"), str) else None
    if message.get("refusal"):
        out = LeafResult.fail(
            "model_grader_refusal_error", f"judge refused: {message['refusal'][:200]}"
        )
    else:
        try:
            out = LeafResult(
                parse_score(str(message.get("content") or ""), *grader.range)
            )
        except ReplyError as e:
            out = LeafResult.fail("model_grader_parse_error", str(e))
    out.token_usage, out.sampled_model_name = tokens, model_name
    return out


async def embed(
    texts: list[str], ctx: GradingContext, client: httpx.AsyncClient
) -> list[list[float]]:
    """Embeddings of ``texts`` from the configured endpoint (raises on failure)."""
    assert ctx.embedding_base_url  # the grader runner checks it first
    url = ctx.embedding_base_url.rstrip("/") + "/embeddings"
    body = {"model": ctx.embedding_model, "input": texts}
    resp = await _post(
        client, url, body, ctx.embedding_api_key, ctx.embedding_timeout_s, 1
    )
    if resp.status_code != 200:
        raise RuntimeError(
            f"embeddings endpoint returned HTTP {resp.status_code}: {resp.text[:300]}"
        )
    data = sorted(resp.json()["data"], key=lambda d: d.get("index", 0))
    return [list(map(float, d["embedding"])) for d in data]
