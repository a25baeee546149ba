"""A job's validation as OpenAI's evals API shapes it: the eval's testing
criteria (the job's graders), a run per evaluated step, an output item per
validation row with each grader's score. Pure functions of the runtime's eval
record; the runner stores what they return and the API serves it."""

from __future__ import annotations

from typing import Any

from areal_marlaas.rundir.records import EvalRecord, EvalSample

# A sample "passes" a grader when it scores at least this (rewards are in [0, 1]).
PASS_SCORE = 0.5


def testing_criteria(grader: dict[str, Any]) -> list[dict[str, Any]]:
    """The eval's criteria: each sub-grader of a multi (named by its key), else
    the grader itself."""
    if grader.get("type") == "multi":
        return [{**sub, "name": key} for key, sub in grader["graders"].items()]
    return [dict(grader)]


def run_result(r: EvalRecord, samples: list[EvalSample]) -> dict[str, Any]:
    """What a run reports beside its id: counts, per-criterion pass/fail, the
    mean reward and each grader's mean, and the error of a failed run."""
    passed = sum(1 for s in samples if _passed(s))
    errored = sum(1 for s in samples if s["reward"] is None)
    per: dict[str, dict[str, Any]] = {}
    for s in samples:
        for g in s["grades"]:
            c = per.setdefault(
                g["name"], {"testing_criteria": g["name"], "passed": 0, "failed": 0}
            )
            c["passed" if g["score"] >= PASS_SCORE else "failed"] += 1
    return {
        "reward_mean": r["reward_mean"],
        "graders": [
            {"name": g["name"], "type": g["type"], "reward_mean": g["reward_mean"]}
            for g in r["graders"]
        ],
        "result_counts": {
            "total": len(samples),
            "passed": passed,
            "failed": len(samples) - passed - errored,
            "errored": errored,
        },
        "per_testing_criteria_results": list(per.values()),
        "error": {"code": "eval_failed", "message": r.get("error", "")}
        if r.get("error")
        else None,
        "eval_s": r["end"] - r["start"],
    }


def output_items(
    samples: list[EvalSample], model: str, temperature: float, max_tokens: int
) -> list[tuple[int, str, dict[str, Any]]]:
    """``(row index, status, body)`` per sample; the body is the API's
    ``datasource_item``, ``results`` and ``sample``."""
    out = []
    for s in samples:
        status = "error" if s["reward"] is None else "pass" if _passed(s) else "fail"
        messages = s["item"].get("messages") or []
        body = {
            "datasource_item": s["item"],
            "results": [
                {
                    "name": g["name"],
                    "type": g["type"],
                    "score": g["score"],
                    "passed": g["score"] >= PASS_SCORE,
                    "sample": None,
                }
                for g in s["grades"]
            ],
            "sample": {
                "input": [
                    {"role": str(m.get("role", "")), "content": str(m.get("content"))}
                    for m in messages
                    if isinstance(m, dict)
                ],
                # A tool agent's whole conversation (assistant turns with their
                # tool calls, tool outputs, the answer), else the one answer.
                "output": [dict(m) for m in convo]
                if (convo := s.get("conversation"))
                else [{"role": "assistant", "content": s["output"]}],
                "model": model,
                "finish_reason": "error" if s["reward"] is None else "stop",
                "error": {"code": "episode_failed", "message": s.get("error", "")}
                if s.get("error")
                else {"code": "", "message": ""},
                "max_completion_tokens": max_tokens,
                "seed": 0,
                "temperature": temperature,
                "top_p": 1.0,
                "usage": {
                    "cached_tokens": 0,
                    "completion_tokens": s.get("output_tokens", 0),
                    "prompt_tokens": s.get("prompt_tokens", 0),
                    "total_tokens": s.get("prompt_tokens", 0)
                    + s.get("output_tokens", 0),
                },
            },
            "reward": s["reward"],
        }
        out.append((s["index"], status, body))
    return out


def _passed(s: EvalSample) -> bool:
    return s["reward"] is not None and s["reward"] >= PASS_SCORE
