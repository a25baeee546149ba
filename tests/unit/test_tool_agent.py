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
    body = json.dumps({"name": name, "arguments": args})
    return f"<tool_call>\n{body}\n</tool_call>"


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
    assert use["calls"] == use["sent"] == len(calls) == 2
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
    assert traj["tool_use"][0]["sent"] == 0


def test_a_tasks_yaml_task_with_tools_runs_the_tool_agent(tmp_path, tokenizer, tools):
    """``marlaas train``: a task with ``agent.tools`` (by URL) and rows of
    messages + tools gets this workflow, its tools and its egress policy."""
    from areal_marlaas.config import TaskSpec
    from areal_marlaas.config.agent import AgentConfig
    from areal_marlaas.config.tasks import TaskDatasetConfig
    from areal_marlaas.workflows import AGENT_WORKFLOW, task_workflow

    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps(row()) + "\n")
    spec = TaskSpec(
        name="agent",
        dataset=TaskDatasetConfig(path=str(data), format="messages"),
        grader={"type": "endpoint", "name": "judge", "url": f"{tools.url}/grade"},
        agent=AgentConfig(
            tools=[{"name": "lookup", "server_url": tools.tool_url("lookup")}],
            max_episode_steps=2,
            egress_allow=["127.0.0.0/8"],
        ),
    )
    path, kwargs = task_workflow(spec, tokenizer.name_or_path)
    assert path == AGENT_WORKFLOW
    assert kwargs["tools"][0]["server_url"] == tools.tool_url("lookup")
    assert kwargs["egress"] == {"allow": ["127.0.0.0/8"], "only_allowed": False}
    wf = ToolAgentWorkflow(**kwargs)
    engine = ScriptedEngine(
        tokenizer, [call("lookup", key="capital_of_x") + EOT, "Zorb" + EOT]
    )
    traj = asyncio.run(wf.arun_episode(engine, row()))
    assert traj["rewards"].item() == 1.0 and len(tools.tool_calls()) == 1


def test_a_task_with_tools_and_its_own_workflow_is_refused():
    from areal_marlaas.config import TaskSpec
    from areal_marlaas.config.agent import AgentConfig
    from areal_marlaas.errors import ConfigError

    with pytest.raises(ConfigError, match="agent.tools runs the tool agent"):
        TaskSpec(
            name="x",
            kind="addition",
            workflow="my.Workflow",
            agent=AgentConfig(tools=[{"name": "s", "server_url": "http://a/"}]),
        )
    with pytest.raises(ConfigError, match="max_episode_steps"):
        AgentConfig(max_episode_steps=0).check("task 'x'")


def test_a_single_turn_job_with_a_grader_endpoint_down_discards_too(tokenizer, tools):
    """The RLVR workflow (a job without tools) scores in its reward pool; an
    endpoint grader that stays down discards the rollout there as well."""
    from areal_marlaas.workflows.reward import IsolatedReward
    from areal_marlaas.workflows.rlvr import MultiTaskRLVRWorkflow

    tools.grader_down = True
    wf = MultiTaskRLVRWorkflow(
        task="single",
        reward_fn="",
        gconfig=GenerationHyperparameters(max_new_tokens=16),
        tokenizer=tokenizer,
        reward_timeout_s=60.0,
        grader={"type": "endpoint", "name": "judge", "url": f"{tools.url}/grade"},
        grading={"egress": {"allow": ["127.0.0.0/8"]}},
    )
    engine = ScriptedEngine(tokenizer, ["Zorb" + EOT])
    try:
        with pytest.raises(RolloutDiscarded, match="endpoint grader 'judge'"):
            asyncio.run(wf.arun_episode(engine, {**row(), "tools": None}))
    finally:
        IsolatedReward.shutdown_all()
    assert len(tools.grades) == 4
