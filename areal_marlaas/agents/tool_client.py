"""Calling a tenant's tool endpoint, with OpenAI's Agent RFT rules.

The body is the Responses-API ``function_call`` item plus the row as ``item``
and the rollout's ``trace_id``; the reply is a ``function_call_output``
(``call_id``, ``output``). Payloads are limited to 1 MB each way: a larger reply
reaches the model as a 413 error text. A 4xx reply (or one that is not a
``function_call_output``) is shown to the model and the episode goes on; a 5xx
or a failed connection is retried ``retries`` times, then the whole rollout is
discarded (``RolloutDiscarded``). A call that runs past ``timeout_s`` is shown
to the model as a timeout. Every connection goes through the egress policy
(``agents/egress.py``): checked again here, pinned to the checked address,
redirects not followed.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

import httpx

from areal_marlaas.agents.egress import EgressError, EgressPolicy
from areal_marlaas.agents.protocol import ToolCall, ToolEndpoint

MAX_PAYLOAD_BYTES = 1024 * 1024
DEFAULT_RETRIES = 3
ERROR_CHARS = 2000  # of a 4xx body shown to the model


class RolloutDiscarded(RuntimeError):
    """The rollout's environment failed (a tool's 5xx after its retries, a
    grader endpoint down): the episode is dropped, not scored as wrong."""


@dataclass
class ToolResult:
    call_id: str
    name: str
    output: str
    error: str = ""  # why the call failed ("" when the tool answered)
    status: int | None = None
    seconds: float = 0.0
    attempts: int = 0


async def read_limited(resp: httpx.Response, limit: int) -> bytes | None:
    """The body, or None when it is over ``limit`` bytes."""
    chunks, size = [], 0
    async for chunk in resp.aiter_bytes():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


async def post_pinned(
    client: httpx.AsyncClient,
    policy: EgressPolicy,
    url: str,
    param: str,
    headers: dict[str, str],
    body: bytes,
    limit: int,
) -> tuple[int, bytes | None]:
    """POST ``body`` to ``url`` at the address the policy checked just now;
    (status, reply or None when over ``limit``)."""
    pinned = await asyncio.to_thread(policy.resolve, url, param)
    request = client.build_request(
        "POST",
        pinned.url,
        content=body,
        headers={
            **headers,
            "Host": pinned.host_header,
            "Content-Type": "application/json",
        },
        extensions={"sni_hostname": pinned.server_name},
    )
    resp = await client.send(request, stream=True, follow_redirects=False)
    try:
        return resp.status_code, await read_limited(resp, limit)
    finally:
        await resp.aclose()


def _output(status: int, raw: bytes | None, call_id: str) -> tuple[str, str]:
    """(text for the model, error) of a reply that is not retried."""
    if raw is None:
        return (
            f"Error 413: the tool's reply is over the {MAX_PAYLOAD_BYTES} byte limit.",
            "reply over 1 MB (413)",
        )
    text = raw.decode("utf-8", errors="replace")
    if 300 <= status < 400:
        return f"Error {status}: the tool redirected; redirects are not followed.", (
            f"HTTP {status} (redirect)"
        )
    if status >= 400:
        return f"Error {status}: {text[:ERROR_CHARS]}", f"HTTP {status}"
    try:
        reply = json.loads(text)
    except json.JSONDecodeError:
        reply = None
    if not isinstance(reply, dict) or not isinstance(reply.get("output"), str):
        return (
            "Error: the tool's reply is not a function_call_output with an output "
            "string.",
            "reply without output",
        )
    if reply.get("call_id") not in (None, call_id):
        return "Error: the tool answered another call_id.", "reply for another call"
    return reply["output"], ""


async def call_tool(
    client: httpx.AsyncClient,
    policy: EgressPolicy,
    endpoint: ToolEndpoint | None,
    call: ToolCall,
    item: dict[str, Any],
    trace_id: str,
    timeout_s: float,
    retries: int = DEFAULT_RETRIES,
    backoff_s: float = 0.5,
) -> ToolResult:
    """One call; raises ``RolloutDiscarded`` when the tool keeps failing."""
    start = time.perf_counter()
    res = ToolResult(call.call_id, call.name, "")

    def done(output: str, error: str = "") -> ToolResult:
        res.output, res.error = output, error
        res.seconds = time.perf_counter() - start
        return res

    if call.error:
        return done(f"Error: could not parse the tool call: {call.error}.", call.error)
    if endpoint is None:
        return done(f"Error: there is no tool named {call.name!r}.", "unknown tool")
    body = json.dumps(
        {**call.function_call(), "item": item, "trace_id": trace_id}
    ).encode()
    if len(body) > MAX_PAYLOAD_BYTES:
        return done(
            f"Error 413: the tool call is over the {MAX_PAYLOAD_BYTES} byte limit.",
            "request over 1 MB (413)",
        )
    param = f"tools.{endpoint.name}.server_url"
    deadline = time.monotonic() + timeout_s
    last = ""
    for attempt in range(retries + 1):
        res.attempts = attempt + 1
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            status, raw = await asyncio.wait_for(
                post_pinned(
                    client,
                    policy,
                    endpoint.server_url,
                    param,
                    endpoint.headers,
                    body,
                    MAX_PAYLOAD_BYTES,
                ),
                timeout=left,
            )
        except TimeoutError:
            break
        except EgressError as e:
            return done(f"Error: the tool's endpoint is refused: {e}", "refused")
        except httpx.HTTPError as e:
            last = f"{type(e).__name__}"
        else:
            res.status = status
            if status < 500:
                return done(*_output(status, raw, call.call_id))
            last = f"HTTP {status}"
        if attempt < retries:
            await asyncio.sleep(
                min(backoff_s * 2**attempt, max(deadline - time.monotonic(), 0))
            )
    else:
        raise RolloutDiscarded(
            f"tool {endpoint.name!r} failed {retries + 1} times ({last}); the "
            "rollout is discarded"
        )
    return done(
        f"Error: the tool did not answer within {timeout_s:g} s.",
        f"timed out after {timeout_s:g} s",
    )
