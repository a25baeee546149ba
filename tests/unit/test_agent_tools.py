"""The Agent RFT pieces against a real tool server on loopback: where tools may
connect, the function_call protocol and its failure rules, the endpoint grader,
and how tool calls appear in the model's text."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from areal_marlaas.agents.egress import EgressError, EgressPolicy
from areal_marlaas.agents.protocol import (
    ToolEndpoint,
    ToolSpecError,
    check_row_tools,
    parse_job_tools,
    parse_tool_calls,
    with_tools,
)
from areal_marlaas.agents.tool_client import RolloutDiscarded, call_tool
from areal_marlaas.graders import GradingContext, grade_batch_sync, parse_grader
from areal_marlaas.graders.endpoint import TRACE_ID
from tests.support.tool_server import ToolServer

LOOPBACK = EgressPolicy(("127.0.0.0/8",))


@pytest.fixture
def tools():
    with ToolServer({"capital_of_x": "Zorb"}) as srv:
        yield srv


# -- egress ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data/",
        "http://10.0.0.5/tool",
        "http://192.168.1.1/tool",
        "http://172.16.0.1/tool",
        "http://100.64.0.1/tool",
        "http://127.0.0.1:9/tool",
        "http://localhost:9/tool",  # a hostname resolving to a refused address
        "http://[::ffff:169.254.169.254]/",  # IPv4-mapped metadata address
        "http://[::1]/tool",
    ],
)
def test_refused_by_default(url):
    with pytest.raises(EgressError, match="tools.0.server_url") as e:
        EgressPolicy().check(url, "tools.0.server_url")
    assert e.value.param == "tools.0.server_url"


def test_allow_list_opens_loopback_but_not_metadata():
    LOOPBACK.check("http://127.0.0.1:9/x", "url")
    with pytest.raises(EgressError):
        LOOPBACK.check("http://169.254.169.254/", "url")
    by_name = EgressPolicy(("localhost",))
    by_name.check("http://localhost:9/x", "url")


def test_only_allowed_refuses_public_addresses():
    with pytest.raises(EgressError):
        EgressPolicy(("127.0.0.0/8",), only_allowed=True).check("http://1.1.1.1/", "u")
    EgressPolicy().check("http://1.1.1.1/", "u")


@pytest.mark.parametrize(
    "url", ["ftp://1.1.1.1/", "http://user:pw@1.1.1.1/", "not a url", ""]
)
def test_bad_urls(url):
    with pytest.raises(EgressError):
        EgressPolicy().check(url, "u")


def test_connection_goes_to_the_checked_address_with_the_name_as_host(tools):
    port = tools.server_address[1]
    pinned = EgressPolicy(("localhost",)).resolve(f"http://localhost:{port}/x", "u")
    assert pinned.address in ("127.0.0.1", "::1")
    assert pinned.host_header == f"localhost:{port}"
    assert "localhost" not in pinned.url


# -- the tool protocol ----------------------------------------------------------


def _call(srv: ToolServer, name: str, args: dict, policy=LOOPBACK, timeout=30.0):
    (_, [call]) = parse_tool_calls(
        f'<tool_call>{{"name": "{name}", "arguments": {json.dumps(args)}}}</tool_call>'
    )
    endpoint = ToolEndpoint(name, srv.tool_url(name), {"Authorization": "Bearer s3"})

    async def go():
        async with httpx.AsyncClient(trust_env=False) as client:
            return await call_tool(
                client,
                policy,
                endpoint,
                call,
                {"messages": [], "answer": "Zorb"},
                "trace_1",
                timeout,
                backoff_s=0.01,
            )

    return call, asyncio.run(go())


def test_a_call_is_a_function_call_item_with_the_row_and_trace(tools):
    call, res = _call(tools, "lookup", {"key": "capital_of_x"})
    assert res.output == "Zorb" and not res.error
    (logged,) = tools.tool_calls("lookup")
    body = logged["body"]
    assert body["type"] == "function_call"
    assert body["call_id"] == call.call_id and body["id"] == call.item_id
    assert json.loads(body["arguments"]) == {"key": "capital_of_x"}
    assert body["item"] == {"messages": [], "answer": "Zorb"}
    assert body["trace_id"] == "trace_1"
    assert logged["headers"]["Authorization"] == "Bearer s3"


def test_a_4xx_is_shown_to_the_model(tools):
    _, res = _call(tools, "bad_request", {})
    assert res.output.startswith("Error 400: bad arguments")
    assert res.error == "HTTP 400" and res.attempts == 1


def test_a_5xx_is_retried_three_times_then_discards_the_rollout(tools):
    with pytest.raises(RolloutDiscarded, match="'broken' failed 4 times"):
        _call(tools, "broken", {})
    assert len(tools.tool_calls("broken")) == 4


def test_a_reply_over_1mb_reaches_the_model_as_413(tools):
    _, res = _call(tools, "huge", {})
    assert res.output.startswith("Error 413")
    assert "413" in res.error


def test_a_hanging_tool_times_out_into_the_conversation(tools):
    _, res = _call(tools, "hang", {}, timeout=1.0)
    assert "did not answer within 1 s" in res.output
    assert res.error.startswith("timed out")


def test_a_refused_address_is_refused_again_at_call_time(tools):
    _, res = _call(tools, "lookup", {"key": "capital_of_x"}, policy=EgressPolicy())
    assert res.error == "refused" and "private, loopback" in res.output
    assert tools.tool_calls() == []


# -- the endpoint grader --------------------------------------------------------


def _grader(srv: ToolServer, **extra) -> dict:
    return {
        "type": "endpoint",
        "name": "judge",
        "url": f"{srv.url}/grade",
        "headers": {"Authorization": "Bearer g5"},
        **extra,
    }


def _ctx(policy=LOOPBACK) -> GradingContext:
    return GradingContext(egress=policy.to_dict(), endpoint_timeout_s=10.0)


def test_endpoint_grader_posts_sample_item_and_the_rollouts_trace_id(tools):
    token = TRACE_ID.set("trace_abc")
    try:
        (r,) = grade_batch_sync(
            parse_grader(_grader(tools)), [("it is Zorb", {"answer": "Zorb"})], _ctx()
        )
    finally:
        TRACE_ID.reset(token)
    assert r.reward == 1.0
    (g,) = tools.grades
    assert g["body"]["trace_id"] == "trace_abc"
    assert g["body"]["item"] == {"answer": "Zorb"}
    assert g["body"]["sample"]["output_text"] == "it is Zorb"
    assert g["headers"]["Authorization"] == "Bearer g5"


def test_endpoint_grader_down_is_unresponsive_after_three_retries(tools):
    tools.grader_down = True
    (r,) = grade_batch_sync(parse_grader(_grader(tools)), [("x", {})], _ctx())
    assert r.errors["unresponsive_reward_error"] is True
    assert "failed 4 times (HTTP 500)" in r.reason
    assert "g5" not in r.reason
    assert len(tools.grades) == 4


def test_endpoint_grader_refused_address_never_connects(tools):
    (r,) = grade_batch_sync(
        parse_grader(_grader(tools)), [("x", {})], _ctx(EgressPolicy())
    )
    assert r.errors["unresponsive_reward_error"] is True
    assert tools.grades == []


def test_endpoint_grader_honors_rate_limit(tools):
    grader = parse_grader(_grader(tools, rate_limit=5))
    start = time.perf_counter()
    grade_batch_sync(grader, [("x", {}), ("y", {}), ("z", {})], _ctx())
    # Three requests at 5/s: the third waits two intervals (a lower bound).
    assert time.perf_counter() - start >= 0.4
    assert len(tools.grades) == 3


def test_endpoint_grader_fields_are_checked():
    from areal_marlaas.graders import GraderError

    with pytest.raises(GraderError, match="rate_limit"):
        parse_grader(
            {"type": "endpoint", "name": "g", "url": "http://x/", "rate_limit": 0}
        )
    with pytest.raises(GraderError, match="url"):
        parse_grader({"type": "endpoint", "name": "g", "url": "file:///etc/passwd"})
    with pytest.raises(GraderError, match="unknown field"):
        parse_grader({"type": "endpoint", "name": "g", "url": "http://x/", "x": 1})


def test_an_endpoint_graders_repr_hides_its_headers(tools):
    grader = parse_grader(_grader(tools))
    assert "g5" not in repr(grader)


# -- tools in the model's text ----------------------------------------------------


def test_parallel_calls_and_unparseable_ones():
    content, calls = parse_tool_calls(
        'Let me look.<tool_call>{"name": "lookup", "arguments": {"key": "a"}}'
        '</tool_call>\n<tool_call>{"name": "echo", "arguments": {"x": 1}}</tool_call>'
        "<tool_call>{oops}</tool_call>"
    )
    assert content == "Let me look."
    assert [c.name for c in calls[:2]] == ["lookup", "echo"]
    assert json.loads(calls[0].arguments) == {"key": "a"}
    assert calls[2].error.startswith("not JSON")
    assert len({c.call_id for c in calls}) == 3


def test_tools_go_into_the_system_message_and_demos_become_text():
    schema = {"type": "function", "function": {"name": "lookup", "parameters": {}}}
    demo = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c",
                "type": "function",
                "function": {"name": "lookup", "arguments": '{"key": "a"}'},
            }
        ],
    }
    out = with_tools([{"role": "user", "content": "q"}, demo], [schema])
    assert out[0]["role"] == "system" and json.dumps(schema) in out[0]["content"]
    assert out[2]["content"] == (
        '<tool_call>\n{"name": "lookup", "arguments": {"key": "a"}}\n</tool_call>'
    )
    _, calls = parse_tool_calls(out[2]["content"])
    assert calls[0].name == "lookup"


def test_job_tools_and_row_schemas_are_validated():
    with pytest.raises(
        ToolSpecError, match=r"tools\.1\.name: tool 'a' is listed twice"
    ):
        parse_job_tools(
            [
                {"name": "a", "server_url": "http://x"},
                {"name": "a", "server_url": "http://y"},
            ],
            "tools",
        )
    with pytest.raises(ToolSpecError, match="headers"):
        parse_job_tools(
            [{"name": "a", "server_url": "http://x", "headers": {"A": 1}}], "t"
        )
    row = {
        "messages": [],
        "tools": [
            {
                "type": "function",
                "function": {"name": "lookup", "parameters": {"type": "objekt"}},
            }
        ],
    }
    with pytest.raises(ValueError, match="not a valid JSON schema"):
        check_row_tools(row, "line 3", {"lookup"})
    row["tools"][0]["function"]["parameters"] = {"type": "object"}
    with pytest.raises(
        ValueError, match="line 3: tools\\[0\\]: tool 'lookup' has no endpoint"
    ):
        check_row_tools(row, "line 3", {"search"})
    assert check_row_tools(row, "line 3", {"lookup"}) == ["lookup"]
