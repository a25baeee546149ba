"""The tool agent's episode on a scripted engine against a real tool server and
reward service on loopback: the model's choices are scripted (the real small
model cannot be made to call a 4xx tool, then answer, on demand); the protocol,
the token layout and the metrics are the workflow's own."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch
from areal.api.cli_args import GenerationHyperparameters

from areal_marlaas.agents.tool_client import RolloutDiscarded
from areal_marlaas.workflows.tool_agent import ToolAgentWorkflow
from tests.support.search import ScriptedEngine
from tests.support.tool_server import ToolServer

EOT = "<|im_end|>"
SCHEMAS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"the {name} tool",
            "parameters": {"type": "object", "properties": {"key": {"type": "string"}}},
        },
    }
    for name in ("lookup", "bad_request", "broken")
]


def call(name: str, **args) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(args)}}}\n</tool_call>'


@pytest.fixture
def tools():
    with ToolServer({"capital_of_x": "Zorb"}) as srv:
        yield srv


def workflow(tokenizer, srv: ToolServer, steps: int = 3, grader: dict | None = None):
    return ToolAgentWorkflow(
        task="agent",
        reward_fn="",
        gconfig=GenerationHyperparameters(max_new_tokens=600),
        tokenizer=tokenizer,
        tools=[
            {
                "name": n,
                "server_url": srv.tool_url(n),
                "headers": {"Authorization": "Bearer t0k"},
            }
            for n in ("lookup", "bad_request", "broken")
        ],
        max_episode_steps=steps,
        tool_timeout_s=30.0,
        egress={"allow": ["127.0.0.0/8"]},
        grader=grader
        or {
            "type": "endpoint",
            "name": "judge",
            "url": f"{srv.url}/grade",
            "headers": {"Authorization": "Bearer g0k"},
        },
    )


def row() -> dict:
    return {
        "messages": [{"role": "user", "content": "What is the capital of X?"}],
        "tools": SCHEMAS,
        "answer": "Zorb",
    }


def episode(tokenizer, srv, turns: list[str], **kw) -> tuple[dict, ScriptedEngine]:
    engine = ScriptedEngine(tokenizer, turns)
    traj = asyncio.run(workflow(tokenizer, srv, **kw).arun_episode(engine, row()))
    return traj, engine


def test_parallel_calls_run_and_their_outputs_are_not_trained_on(tokenizer, tools):
    turns = [
        call("lookup", key="capital_of_x") + call("bad_request") + EOT,
        "The capital is Zorb." + EOT,
    ]
    traj, engine = episode(tokenizer, tools, turns)
    # Both calls of the first turn reached the tool server, with the row and
    # one trace id that the grader got too.
    calls = tools.tool_calls()
    assert sorted(c["path"] for c in calls) == ["/tools/bad_request", "/tools/lookup"]
    (grade,) = tools.grades
    assert {c["body"]["trace_id"] for c in calls} == {grade["body"]["trace_id"]}
    assert grade["body"]["trace_id"] == traj["trace_ids"][0]
    assert all(c["body"]["item"]["answer"] == "Zorb" for c in calls)
    assert traj["rewards"].item() == 1.0
    # The second request continues the first: prompt, turn 1, tool messages.
    second = engine.requests[1].input_ids
    assert second[: len(engine.requests[0].input_ids)] == engine.requests[0].input_ids
    tail = tokenizer.decode(second[len(engine.requests[0].input_ids) :])
    assert "Zorb" in tail and "Error 400: bad arguments" in tail
    # Loss mask 1 exactly on the two generated turns, with their version.
    mask = traj["loss_mask"][0].bool()
    generated = traj["input_ids"][0][mask].tolist()
    assert generated == engine.outputs[0] + engine.outputs[1]
    assert set(traj["versions"][0][mask].tolist()) == {3}
    assert set(traj["versions"][0][~mask].tolist()) == {-1}
    assert torch.all(traj["logprobs"][0][~mask] == 0)
    # The step metrics count what the tool server saw.
    (use,) = traj["tool_use"]
    assert use["calls"] == len(calls) == 2
    assert use["errors"] == 1 and use["turns"] == 2
    convo = traj["conversations"][0]
    assert [m["role"] for m in convo] == ["assistant", "tool", "tool", "assistant"]
    assert convo[-1]["content"] == "The capital is Zorb."


def test_max_episode_steps_ends_the_episode(tokenizer, tools):
    turns = [call("lookup", key="capital_of_x") + EOT] * 3
    traj, engine = episode(tokenizer, tools, turns, steps=2)
    assert len(engine.requests) == 2
    assert len(tools.tool_calls()) == 1  # the last turn's call is not run
    assert traj["tool_use"][0]["turns"] == 2


def test_a_broken_tool_discards_the_rollout(tokenizer, tools):
    turns = [call("broken") + EOT, "Zorb" + EOT]
    with pytest.raises(RolloutDiscarded, match="'broken' failed 4 times"):
        episode(tokenizer, tools, turns)
    assert tools.grades == []  # never scored


def test_a_grader_that_stays_down_discards_the_rollout(tokenizer, tools):
    tools.grader_down = True
    with pytest.raises(RolloutDiscarded, match="endpoint grader 'judge'"):
        episode(tokenizer, tools, ["Zorb" + EOT])
    assert len(tools.grades) == 4


def test_an_unknown_tool_is_an_error_the_model_reads(tokenizer, tools):
    turns = [call("teleport") + EOT, "Zorb" + EOT]
    traj, engine = episode(tokenizer, tools, turns)
    assert tools.tool_calls() == []
    assert "no tool named 'teleport'" in traj["conversations"][0][1]["content"]
    assert traj["tool_use"][0]["errors"] == 1
