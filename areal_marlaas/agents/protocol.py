"""OpenAI's Agent RFT shapes: a job's tool endpoints, a row's tool schemas, and
how tools and tool calls appear in the model's text.

A job lists its tools as ``{name, server_url, headers}``; every training row
lists the tools the model may call as chat-completions function schemas
(``{"type": "function", "function": {name, description, parameters}}``). A
row's tool must have an endpoint in the job.

Tools reach the model in the Hermes format (Qwen2.5's and vLLM's ``hermes``
parser's): a ``# Tools`` section in the system message with each schema as one
JSON line inside ``<tools></tools>``, and calls written as
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, several per turn
when the model calls tools in parallel. A chat template with its own tools
section (it reads ``tools``) renders them itself.
"""

from __future__ import annotations

import contextlib
import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from jsonschema import SchemaError
from jsonschema.validators import validator_for

TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_TOOLS = 32
MAX_HEADERS = 32


def redacted(headers: dict[str, str] | None) -> dict[str, str]:
    """Header names with their values hidden, as API responses show them."""
    return {k: "<redacted>" for k in headers or {}}


class ToolSpecError(ValueError):
    """A tool list or schema the service cannot use; ``param`` names the field."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class ToolEndpoint:
    """Where one tool runs. ``headers`` are the tenant's secrets: never in a
    repr, a log line, an event or an API response."""

    name: str
    server_url: str
    headers: dict[str, str] = field(default_factory=dict, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "server_url": self.server_url,
            "headers": dict(self.headers),
        }

    def public(self) -> dict[str, Any]:
        """As an API response shows it: header names, values redacted."""
        return {
            "name": self.name,
            "server_url": self.server_url,
            "headers": redacted(self.headers),
        }


def check_headers(value: object, param: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > MAX_HEADERS:
        raise ToolSpecError(
            f"{param} must be an object of at most {MAX_HEADERS} string headers.",
            param,
        )
    for k, v in value.items():
        if not isinstance(v, str) or not re.fullmatch(
            r"[!#$%&'*+.^_`|~0-9A-Za-z-]+", k
        ):
            raise ToolSpecError(
                f"{param}.{k}: header names are HTTP tokens and values strings.",
                f"{param}.{k}",
            )
        if "\n" in v or "\r" in v:
            raise ToolSpecError(f"{param}.{k}: a header value has a newline.", param)
    return dict(value)


def parse_job_tools(value: object, param: str) -> list[ToolEndpoint]:
    """The job's ``tools``: a non-empty list of ``{name, server_url, headers}``."""
    if not isinstance(value, list) or not value or len(value) > MAX_TOOLS:
        raise ToolSpecError(
            f"{param} must be a list of 1 to {MAX_TOOLS} tools, each "
            "{name, server_url, headers}.",
            param,
        )
    out: list[ToolEndpoint] = []
    for i, tool in enumerate(value):
        where = f"{param}.{i}"
        if not isinstance(tool, dict):
            raise ToolSpecError(f"{where} must be an object.", where)
        extra = sorted(set(tool) - {"name", "server_url", "headers"})
        if extra:
            raise ToolSpecError(
                f"{where}.{extra[0]}: unknown field; a tool takes name, server_url "
                "and headers.",
                f"{where}.{extra[0]}",
            )
        name = tool.get("name")
        if not isinstance(name, str) or not TOOL_NAME.match(name):
            raise ToolSpecError(
                f"{where}.name must be 1 to 64 letters, digits, '_' or '-'.",
                f"{where}.name",
            )
        if any(t.name == name for t in out):
            raise ToolSpecError(f"{where}.name: tool {name!r} is listed twice.", where)
        url = tool.get("server_url")
        if not isinstance(url, str) or not url:
            raise ToolSpecError(f"{where}.server_url is required: a URL.", where)
        out.append(
            ToolEndpoint(
                name, url, check_headers(tool.get("headers"), f"{where}.headers")
            )
        )
    return out


def check_row_tools(row: dict, where: str, endpoints: set[str]) -> list[str]:
    """Raise ``ValueError`` naming ``where`` unless the row's ``tools`` are
    function schemas (``parameters`` a valid JSON schema) whose names all have
    an endpoint; returns the names."""
    tools = row.get("tools")
    if tools is None:
        raise ValueError(
            f"{where}: a job with tools needs 'tools' in every line: the function "
            "schemas the model may call."
        )
    if not isinstance(tools, list) or not tools:
        raise ValueError(f"{where}: 'tools' must be a non-empty list.")
    names = []
    for i, t in enumerate(tools):
        at = f"{where}: tools[{i}]"
        fn = t.get("function") if isinstance(t, dict) else None
        if (
            not isinstance(t, dict)
            or t.get("type") != "function"
            or not isinstance(fn, dict)
        ):
            raise ValueError(
                f'{at} must be {{"type": "function", "function": {{name, '
                "description, parameters}}}."
            )
        name = fn.get("name")
        if not isinstance(name, str) or not TOOL_NAME.match(name):
            raise ValueError(f"{at}.function.name must be 1 to 64 letters/digits/_/-.")
        if name not in endpoints:
            raise ValueError(
                f"{at}: tool {name!r} has no endpoint in the job's "
                f"method.reinforcement.tools (it lists {sorted(endpoints)})."
            )
        desc = fn.get("description")
        if desc is not None and not isinstance(desc, str):
            raise ValueError(f"{at}.function.description must be a string.")
        params = fn.get("parameters")
        if params is not None:
            if not isinstance(params, dict):
                raise ValueError(
                    f"{at}.function.parameters must be a JSON schema object."
                )
            try:
                validator_for(params).check_schema(params)
            except SchemaError as e:
                raise ValueError(
                    f"{at}.function.parameters is not a valid JSON schema: {e.message}"
                ) from None
        names.append(name)
    return names


# --- the model's text ---------------------------------------------------------

TOOLS_PREAMBLE = (
    "# Tools\n\nYou may call one or more functions to assist with the user query."
    "\n\nYou are provided with function signatures within <tools></tools> XML tags:"
    "\n<tools>\n"
)
TOOLS_POSTAMBLE = (
    "\n</tools>\n\nFor each function call, return a json object with function name "
    "and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)
CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def tools_section(tools: list[dict]) -> str:
    return TOOLS_PREAMBLE + "\n".join(json.dumps(t) for t in tools) + TOOLS_POSTAMBLE


def template_reads_tools(tokenizer) -> bool:
    template = getattr(tokenizer, "chat_template", None) or ""
    return isinstance(template, str) and "tools" in template


def calls_as_text(message: dict) -> dict:
    """An assistant message whose ``tool_calls`` are written into its content
    in the Hermes format (a few-shot demonstration, for a template that has no
    tool section)."""
    calls = message.get("tool_calls") or []
    if not calls:
        return dict(message)
    parts = [message.get("content") or ""]
    for c in calls:
        fn = c.get("function", {}) if isinstance(c, dict) else {}
        args = fn.get("arguments", "{}")
        with contextlib.suppress(json.JSONDecodeError):
            args = json.loads(args) if isinstance(args, str) else args
        parts.append(
            "<tool_call>\n"
            + json.dumps({"name": fn.get("name"), "arguments": args})
            + "\n</tool_call>"
        )
    out = {k: v for k, v in message.items() if k != "tool_calls"}
    out["content"] = "\n".join(p for p in parts if p)
    return out


def with_tools(messages: list[dict], tools: list[dict]) -> list[dict]:
    """``messages`` with the tools section in the system message (one is added
    in front when the conversation has none) and demonstrated calls as text."""
    section = tools_section(tools)
    out = [calls_as_text(m) for m in messages]
    if out and out[0].get("role") in ("system", "developer"):
        out[0] = {
            **out[0],
            "role": "system",
            "content": f"{out[0]['content']}\n\n{section}",
        }
        return out
    return [{"role": "system", "content": section}, *out]


def prompt_messages(row: dict) -> list[dict]:
    """The messages a row's prompt is rendered from: with its tools section
    when it has tools (what prompt-length limits measure)."""
    if row.get("tools"):
        return with_tools(row["messages"], row["tools"])
    return row["messages"]


@dataclass(frozen=True)
class ToolCall:
    """One call the model made: ids in OpenAI's shapes, arguments as JSON text;
    ``error`` is why it cannot be sent (unparseable, not an object)."""

    call_id: str
    item_id: str
    name: str
    arguments: str
    error: str = ""

    def function_call(self) -> dict[str, Any]:
        """The Responses-API ``function_call`` item."""
        return {
            "type": "function_call",
            "id": self.item_id,
            "call_id": self.call_id,
            "name": self.name,
            "arguments": self.arguments,
        }

    def chat(self) -> dict[str, Any]:
        """The chat-completions ``tool_calls`` entry."""
        return {
            "id": self.call_id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


def _ids() -> tuple[str, str]:
    h = uuid.uuid4().hex
    return f"call_{h[:24]}", f"fc_{h[8:32]}"


def parse_tool_calls(text: str) -> tuple[str, list[ToolCall]]:
    """The turn's text outside tool calls, and its calls in order."""
    calls = []
    for m in CALL.finditer(text):
        call_id, item_id = _ids()
        raw = m.group(1).strip()
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as e:
            calls.append(ToolCall(call_id, item_id, "", raw, f"not JSON ({e.msg})"))
            continue
        name = obj.get("name") if isinstance(obj, dict) else None
        args = obj.get("arguments", {}) if isinstance(obj, dict) else None
        if not isinstance(name, str) or not isinstance(args, dict | str):
            calls.append(
                ToolCall(
                    call_id,
                    item_id,
                    name if isinstance(name, str) else "",
                    raw,
                    'a call is {"name": <string>, "arguments": <object>}',
                )
            )
            continue
        arguments = args if isinstance(args, str) else json.dumps(args)
        calls.append(ToolCall(call_id, item_id, name, arguments))
    content = CALL.sub("", text).strip()
    return content, calls
