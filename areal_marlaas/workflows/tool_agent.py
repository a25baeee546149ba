"""Multi-turn tool agent: the tenant's tools, called over HTTP in OpenAI's Agent
RFT protocol, graded by the task's grader (an ``endpoint`` grader among them).

Each row is ``{"messages": [...], "tools": [function schemas], <fields>}``. The
tools are rendered into the prompt (``agents/protocol.py``); the model answers or
calls tools (several per turn run together); tool outputs come back as ``tool``
messages through the chat template; this repeats until a turn has no tool call
or ``max_episode_steps`` turns were generated. Every call of one episode carries
the same ``trace_id``, which the endpoint grader sends too.

The trajectory is AReaL's RLVR layout, as in the search agent: generated tokens
exactly as the server returned them (loss mask 1, their logprobs and adapter
version); template and tool-output tokens with loss mask 0, logprob 0 and
version -1. Tool calls are awaited on the event loop without blocking it, so a
slow tool overlaps other tasks' generation and the trainer's steps.

A tool's 5xx after its retries, or an endpoint grader that stays down, raises
``RolloutDiscarded``: the episode's group is dropped from the step and counted,
never scored as a wrong answer.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import httpx
from areal import workflow_context
from areal.api.cli_args import GenerationHyperparameters
from areal.api.io_struct import ModelRequest
from areal.api.reward_api import AsyncRewardWrapper
from areal.api.workflow_api import RolloutWorkflow
from areal.utils import logging, stats_tracker
from areal.utils.dynamic_import import import_from_string
from areal.utils.hf_utils import apply_chat_template, load_hf_tokenizer
from transformers import PreTrainedTokenizerFast

from areal_marlaas.agents.egress import EgressPolicy
from areal_marlaas.agents.protocol import (
    ToolEndpoint,
    parse_tool_calls,
    template_reads_tools,
    with_tools,
)
from areal_marlaas.agents.tool_client import RolloutDiscarded, ToolResult, call_tool
from areal_marlaas.graders import (
    GradingContext,
    build_sample,
    endpoint_failure,
    grade_batch,
    parse_grader,
)
from areal_marlaas.graders.endpoint import TRACE_ID
from areal_marlaas.rollout.seeding import seeded_sampling
from areal_marlaas.trajectory import EpisodeTokens, collect_served_adapters
from areal_marlaas.workflows.base import TaskWorkflow

if TYPE_CHECKING:
    from areal_marlaas.config import FaultToleranceConfig, TaskSpec

logger = logging.getLogger("MARLaaSToolAgent")

_MARK = "\x00marlaas-turn\x00"


class ToolAgentWorkflow(TaskWorkflow, RolloutWorkflow):
    """One task's tool agent; requests route to the task's adapter.

    ``gconfig.max_new_tokens`` is the episode's response budget: generated and
    tool tokens together, so prompt + response fits the task's KV estimate.
    """

    def __init__(
        self,
        task: str,
        reward_fn: Callable[..., Any] | str,
        gconfig: GenerationHyperparameters,
        tokenizer: PreTrainedTokenizerFast | str,
        tools: list[dict] | None = None,
        max_episode_steps: int = 10,
        max_turn_tokens: int = 0,
        tool_timeout_s: float = 600.0,
        tool_retries: int = 3,
        egress: dict | None = None,
        enable_thinking: bool = False,
        sampling_seed: int | None = None,
        grader: dict | None = None,
        grading: dict | None = None,
    ):
        if isinstance(tokenizer, str):
            tokenizer = load_hf_tokenizer(tokenizer)
        self.tokenizer = tokenizer
        self.task = task
        self.sampling_seed = sampling_seed
        self.gconfig = gconfig.new(lora_name=task).new_with_stop_and_pad_token_ids(
            tokenizer
        )
        self.endpoints = {
            t["name"]: ToolEndpoint(t["name"], t["server_url"], t.get("headers") or {})
            for t in tools or []
        }
        self.max_episode_steps = max_episode_steps
        self.max_turn_tokens = max_turn_tokens
        self.tool_timeout_s = tool_timeout_s
        self.tool_retries = tool_retries
        self.policy = EgressPolicy.from_dict(egress)
        self.enable_thinking = enable_thinking
        self.grader = parse_grader(grader) if grader is not None else None
        ctx = GradingContext.from_dict(grading)
        if egress is not None:
            ctx.egress = dict(egress)
        ctx.load_extensions()
        self.grading = ctx
        self.reward_fn = reward_fn
        self.async_reward_fn: AsyncRewardWrapper | None = None
        self._native_tools = template_reads_tools(tokenizer)
        self._client: httpx.AsyncClient | None = None

    @classmethod
    def workflow_kwargs(
        cls,
        task: TaskSpec,
        tokenizer_path: str,
        fault: FaultToleranceConfig | None = None,
        grading: dict | None = None,
    ) -> dict[str, Any]:
        a = task.agent
        return {
            **super().workflow_kwargs(task, tokenizer_path, fault, grading),
            "tools": [dict(t) for t in a.tools],
            "max_episode_steps": a.max_episode_steps,
            "max_turn_tokens": a.max_turn_tokens,
            "tool_timeout_s": a.tool_timeout_s,
            "tool_retries": a.tool_retries,
            "egress": EgressPolicy(
                tuple(a.egress_allow), a.egress_only_allowed
            ).to_dict(),
        }

    # -- text and tokens ----------------------------------------------------------
    def _render(self, messages: list[dict], tools: list[dict], **kw) -> Any:
        if self._native_tools:
            return apply_chat_template(self.tokenizer, messages, tools=tools, **kw)
        return apply_chat_template(self.tokenizer, with_tools(messages, tools), **kw)

    def _after_turn(self, tool_msgs: list[dict], ended: bool) -> list[int]:
        """The template's tokens between a generated turn and the next one: the
        turn's close (unless generation ended on the end-of-turn token), the
        tool messages, and the next assistant header."""
        base = [
            {"role": "user", "content": "."},
            {"role": "assistant", "content": _MARK},
        ]
        closed = apply_chat_template(self.tokenizer, base, tokenize=False)
        full = apply_chat_template(
            self.tokenizer, base + tool_msgs, tokenize=False, add_generation_prompt=True
        )
        text = full[full.index(_MARK) + len(_MARK) :]
        eos = str(self.tokenizer.eos_token or "")
        close = closed[closed.index(_MARK) + len(_MARK) :]
        if ended and eos and close.startswith(eos) and text.startswith(eos):
            text = text[len(eos) :]
        return self.tokenizer.encode(text, add_special_tokens=False)

    def _decode(self, ids: list[int]) -> str:
        return cast(str, self.tokenizer.decode(ids, skip_special_tokens=True))

    # -- scoring --------------------------------------------------------------------
    async def _score(
        self, data: dict, sample: dict, prompt_ids: list[int], completion_ids: list[int]
    ) -> tuple[float, list[dict], str]:
        item = dict(data)
        if self.grader is not None:
            (result,) = await grade_batch(self.grader, [(sample, item)], self.grading)
            why = endpoint_failure(list(result.per_grader), [result.reason])
            if why:
                raise RolloutDiscarded(why)
            return result.reward, [dict(g) for g in result.per_grader], result.reason
        if self.async_reward_fn is None:
            fn = self.reward_fn
            fn = import_from_string(fn) if isinstance(fn, str) else fn
            self.async_reward_fn = AsyncRewardWrapper(fn)
        reward = await self.async_reward_fn(
            self._decode(prompt_ids),
            sample["output_text"],
            prompt_ids,
            completion_ids,
            **item,
        )
        return float(reward), [], ""

    # -- episode ----------------------------------------------------------------------
    async def arun_episode(self, engine, data: dict[str, Any]) -> dict[str, Any]:
        trace_id = f"trace_{uuid.uuid4().hex}"
        token = TRACE_ID.set(trace_id)
        try:
            with (
                seeded_sampling(self.sampling_seed),
                collect_served_adapters() as served,
            ):
                traj = await self._episode(engine, data, trace_id)
        finally:
            TRACE_ID.reset(token)
        traj["served_adapters"] = list(served)
        return traj

    def _http(self) -> httpx.AsyncClient:
        # One client per event loop that runs episodes (the worker's).
        if self._client is None:
            self._client = httpx.AsyncClient(
                trust_env=False, timeout=self.tool_timeout_s
            )
        return self._client

    async def _episode(self, engine, data: dict[str, Any], trace_id: str) -> dict:
        tools = list(data.get("tools") or [])
        messages = list(data["messages"])
        item = dict(data)  # the row, as OpenAI sends it to tools and graders
        tokens = EpisodeTokens(
            list(
                self._render(
                    messages,
                    tools,
                    tokenize=True,
                    add_generation_prompt=True,
                    enable_thinking=self.enable_thinking,
                )
            )
        )
        budget = self.gconfig.max_new_tokens
        rid = uuid.uuid4().hex
        conversation: list[dict] = []
        results: list[ToolResult] = []
        tool_tokens = 0
        env: list[float] = []
        final, turns, end = "", 0, "answered"
        eos_ids = set(self.gconfig.stop_token_ids or [])
        while True:
            room = budget - len(tokens.response)
            if room <= 0:
                end = "token budget used up"
                break
            if self.max_turn_tokens:
                room = min(room, self.max_turn_tokens)
            resp = await engine.agenerate(
                ModelRequest(
                    rid=rid,
                    input_ids=list(tokens.ids),
                    gconfig=self.gconfig.new(n_samples=1, max_new_tokens=room),
                    tokenizer=self.tokenizer,
                )
            )
            out = tokens.generated(resp)
            turns += 1
            content, calls = parse_tool_calls(self._decode(out))
            turn: dict[str, Any] = {"role": "assistant", "content": content}
            if calls:
                turn["tool_calls"] = [c.chat() for c in calls]
            conversation.append(turn)
            final = content
            if not calls:
                break
            if turns >= self.max_episode_steps:
                end = f"max_episode_steps={self.max_episode_steps} reached"
                break
            t0 = time.time()
            done = await asyncio.gather(
                *(
                    call_tool(
                        self._http(),
                        self.policy,
                        self.endpoints.get(c.name),
                        c,
                        item,
                        trace_id,
                        self.tool_timeout_s,
                        self.tool_retries,
                    )
                    for c in calls
                )
            )
            env += [t0, time.time()]
            results += done
            tool_msgs = [
                {
                    "role": "tool",
                    "tool_call_id": r.call_id,
                    "name": r.name,
                    "content": r.output,
                }
                for r in done
            ]
            conversation += tool_msgs
            ended = bool(out) and out[-1] in eos_ids
            piece = self._after_turn(tool_msgs, ended)
            piece = piece[: budget - len(tokens.response)]
            tool_tokens += len(piece)
            tokens.context(piece)

        calls_made = [tc for m in conversation for tc in m.get("tool_calls", [])]
        sample = build_sample(final, output_tools=calls_made, messages=conversation)
        reward, grades, reason = await self._score(
            data, sample, tokens.prompt, tokens.response
        )
        errors = sum(bool(r.error) for r in results)
        if reason or end != "answered":
            logger.info(f"task {self.task}: reward {reward} ({reason or end})")
        traj = tokens.trajectory(self.task, reward)
        scope = f"{workflow_context.stat_scope()}/{self.task}"
        stats_tracker.get(scope).scalar(
            reward=reward, tool_calls=float(len(results)), tool_errors=float(errors)
        )
        traj["env_intervals"] = env
        traj["grades"] = grades
        traj["reward_reasons"] = [reason] if reason else []
        # One entry per episode (lists concatenate across a group).
        traj["tool_use"] = [
            {
                "calls": len(results),
                # Calls that went out (not an unknown tool, unparseable, ...).
                "sent": sum(r.attempts > 0 for r in results),
                "errors": errors,
                "seconds": sum(r.seconds for r in results),
                "output_tokens": tool_tokens,
                "turns": turns,
            }
        ]
        traj["conversations"] = [conversation]
        traj["trace_ids"] = [trace_id]
        return traj
