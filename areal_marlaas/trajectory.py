"""What a rollout hands the trainer, read the same way by every layer.

A trajectory is AReaL's RLVR layout (``input_ids``, ``loss_mask``, ``logprobs``,
``versions``, ``rewards``, ... as [n, L] tensors, or AReaL ``RTensor`` handles when
the rollout ran on a worker) plus plain-Python extras:

* ``task``: the task's name;
* ``served_adapters``: the adapter name the server reported for each generation
  request (the audit compares it with the version the tokens are labelled with);
* ``env_intervals``: ``[start, end, start, end, ...]`` wall-clock seconds the
  episode spent in its environment (tool calls), for the ``env`` phase;
* ``reward_reasons``: why samples scored as they did, when a grader said (a
  python grader that raised, a judge that did not answer, ...);
* ``grades``: each grader's verdict on the episode's samples (``GraderGrade``:
  name, type, score, error flags, seconds, a model grader's tokens), when the
  task has a grader;
* ``tool_use``: a tool agent's episodes, one dict each (calls, errors, seconds
  in tools, tokens the tool messages added, turns); ``conversations``: each
  episode's generated conversation (assistant turns, tool calls, tool outputs);
  ``trace_ids``: each episode's trace id (its tool calls' and grader's).

A failed episode comes back as ``{FAILURE: reason}`` instead of a trajectory, so
the reason reaches the scheduler on every placement (in-process, AReaL workers).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any, Protocol

import torch

from areal_marlaas.rundir.records import GraderStat, ToolUse

FAILURE = "marlaas_episode_error"

# The served-adapter names of the episode running in this asyncio task: the
# engine appends one per generation request (see ``collect_served_adapters``).
_SERVED: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar(
    "marlaas_served_adapters", default=None
)


def failure(reason: str) -> dict[str, str]:
    return {FAILURE: reason}


def failure_reason(item: Any) -> str | None:
    """The reason of a failed episode's marker, else None."""
    if isinstance(item, dict) and FAILURE in item:
        return str(item[FAILURE])
    return None


def tensor(x: Any) -> torch.Tensor:
    """A plain tensor from a tensor or an AReaL RTensor (single-controller mode)."""
    if torch.is_tensor(x):
        return x
    from areal.infra.rpc.rtensor import RTensor

    return RTensor.localize(x)


def generated_versions(traj: dict[str, Any]) -> set[int]:
    """The adapter versions that produced a trajectory's generated tokens."""
    mask = tensor(traj["loss_mask"]).bool()
    return set(tensor(traj["versions"])[mask].tolist())


def staleness(batch: list[dict[str, Any]], version: int) -> int:
    """How many versions behind ``version`` the oldest generated token is."""
    return max(version - min(generated_versions(t)) for t in batch)


def generated_tokens(batch: list[dict[str, Any]]) -> int:
    """Tokens the policy generated in the batch (what a step trains on)."""
    return int(sum(int(tensor(t["loss_mask"]).sum()) for t in batch))


def rewards(batch: list[dict[str, Any]]) -> torch.Tensor:
    return torch.cat([tensor(t["rewards"]).flatten() for t in batch])


def served_adapters(batch: list[dict[str, Any]]) -> list[str]:
    """Every adapter name the server reported for the batch's requests."""
    return [n for t in batch for n in t.get("served_adapters", [])]


def reward_reasons(batch: list[dict[str, Any]]) -> dict[str, int]:
    """How often each grading error occurred in the batch."""
    counts: dict[str, int] = {}
    for t in batch:
        for reason in t.get("reward_reasons", []):
            counts[reason] = counts.get(reason, 0) + 1
    return counts


def grader_stats(batch: list[dict[str, Any]]) -> list[GraderStat]:
    """Per grader over the batch: its mean score, how many samples it graded,
    how often each error flag came up, its mean seconds and model tokens."""
    acc: dict[str, GraderStat] = {}
    for t in batch:
        for g in t.get("grades", []):
            s = acc.setdefault(
                g["name"],
                {
                    "name": g["name"],
                    "type": g["type"],
                    "reward_mean": 0.0,
                    "samples": 0,
                    "errors": {},
                    "seconds_mean": 0.0,
                    "prompt_tokens": 0,
                    "completion_tokens": 0,
                },
            )
            s["samples"] += 1
            s["reward_mean"] += float(g["score"])  # a sum until the end
            s["seconds_mean"] += float(g.get("seconds", 0.0))
            s["prompt_tokens"] += int(g.get("prompt_tokens", 0))
            s["completion_tokens"] += int(g.get("completion_tokens", 0))
            for flag in g.get("errors", []):
                s["errors"][flag] = s["errors"].get(flag, 0) + 1
    for s in acc.values():
        s["reward_mean"] /= s["samples"]
        s["seconds_mean"] /= s["samples"]
    return list(acc.values())


class Generated(Protocol):
    """What a generation returns (AReaL's ``ModelResponse``)."""

    output_tokens: list[int]
    output_logprobs: list[float]
    output_versions: list[int]


class EpisodeTokens:
    """One multi-turn episode in AReaL's RLVR layout, built as it runs: the
    policy's tokens exactly as the server returned them (loss mask 1, their
    logprobs and adapter versions), everything else (prompt, tool outputs,
    template tokens) with loss mask 0, logprob 0 and version -1."""

    def __init__(self, prompt: list[int]):
        self.prompt = list(prompt)
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.loss_mask: list[int] = []
        self.versions: list[int] = []
        self.context(self.prompt)

    @property
    def response(self) -> list[int]:
        """Everything after the prompt (generated and tool tokens)."""
        return self.ids[len(self.prompt) :]

    def generated(self, resp: Generated) -> list[int]:
        out = list(resp.output_tokens)
        self.ids += out
        self.logprobs += list(resp.output_logprobs)
        self.loss_mask += [1] * len(out)
        self.versions += list(resp.output_versions)
        return out

    def context(self, ids: list[int]) -> None:
        self.ids += ids
        self.logprobs += [0.0] * len(ids)
        self.loss_mask += [0] * len(ids)
        self.versions += [-1] * len(ids)

    def trajectory(self, task: str, reward: float) -> dict[str, Any]:
        """The [1, L] tensors plus ``task``; raises if the generated tokens
        came from more than one adapter version (the engine pins one)."""
        traj: dict[str, Any] = {
            "input_ids": torch.tensor(self.ids, dtype=torch.int32),
            "loss_mask": torch.tensor(self.loss_mask, dtype=torch.int32),
            "logprobs": torch.tensor(self.logprobs, dtype=torch.float32),
            "versions": torch.tensor(self.versions, dtype=torch.int32),
            "attention_mask": torch.ones(len(self.ids), dtype=torch.bool),
            "rewards": torch.tensor(reward, dtype=torch.float32),
        }
        traj = {k: v.unsqueeze(0) for k, v in traj.items()}
        found = generated_versions(traj)
        if len(found) != 1:
            raise RuntimeError(
                f"task {task}: episode mixes adapter versions {sorted(found)}"
            )
        traj["task"] = task
        return traj


def tool_use(batch: list[dict[str, Any]]) -> ToolUse | None:
    """OpenAI's Agent RFT step metrics over a batch of tool-agent episodes:
    tool calls per rollout, mean tokens per tool call, mean tool execution
    latency, tool error count (None for a batch without tools)."""
    eps = [e for t in batch for e in t.get("tool_use", [])]
    if not eps:
        return None
    calls = sum(e["calls"] for e in eps)
    return {
        "rollouts": len(eps),
        "calls": calls,
        "sent": sum(e.get("sent", 0) for e in eps),
        "calls_per_rollout": calls / len(eps),
        "tokens_per_call": sum(e["output_tokens"] for e in eps) / calls
        if calls
        else 0.0,
        "latency_s_mean": sum(e["seconds"] for e in eps) / calls if calls else 0.0,
        "errors": sum(e["errors"] for e in eps),
        "turns_mean": sum(e["turns"] for e in eps) / len(eps),
    }


def env_intervals(batch: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """The batch's environment intervals (tool calls), as (start, end) pairs."""
    out = []
    for t in batch:
        flat = list(t.get("env_intervals", []))
        out += list(zip(flat[0::2], flat[1::2], strict=True))
    return out


@contextlib.contextmanager
def collect_served_adapters() -> Iterator[list[str]]:
    """Collect the server-reported adapter names of the requests made inside."""
    names: list[str] = []
    token = _SERVED.set(names)
    try:
        yield names
    finally:
        _SERVED.reset(token)


def record_served_adapter(name: str) -> None:
    names = _SERVED.get()
    if names is not None:
        names.append(name)
