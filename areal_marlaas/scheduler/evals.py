"""A held-out eval of one committed version: the task's eval rows, one sample
each, generated on the shared server with the version just published (the same
adapter the task's next rollout uses) and scored by the task's own reward or
grader. It only reads the server: the task's training never waits for it."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from areal_marlaas import trajectory
from areal_marlaas.rundir.records import EvalRecord, EvalSample
from areal_marlaas.scheduler.backends import RolloutBackend

if TYPE_CHECKING:
    from areal_marlaas.scheduler.runtime import TaskRun


def run_eval(
    rollout: RolloutBackend,
    t: TaskRun,
    version: int,
    timeout: float | None = None,
) -> tuple[EvalRecord, list[EvalSample]]:
    rows = t.eval_rows or []
    start = time.time()
    results = rollout.rollout_task(rows, t.workflow, t.workflow_kwargs, 1, timeout)
    samples: list[EvalSample] = []
    ok: list[dict[str, Any]] = []
    for i, (row, traj) in enumerate(zip(rows, results, strict=True)):
        why = trajectory.failure_reason(traj)
        if traj is None or why is not None:
            samples.append(_failed(i, row, why or "no trajectory came back"))
            continue
        ok.append(traj)
        prompt, output, n_prompt, n_output = _texts(traj, t.data.tokenizer)
        samples.append(
            {
                "index": i,
                "item": _plain(row),
                "prompt": prompt,
                "output": output,
                "reward": float(trajectory.rewards([traj]).mean()),
                "grades": list(traj.get("grades", [])),
                "prompt_tokens": n_prompt,
                "output_tokens": n_output,
            }
        )
        if traj.get("conversations"):
            samples[-1]["conversation"] = traj["conversations"][0]
    versions = sorted({v for x in ok for v in trajectory.generated_versions(x)})
    record: EvalRecord = {
        "task": t.name,
        "version": version,
        "reward_mean": float(trajectory.rewards(ok).mean()) if ok else None,
        "samples": len(ok),
        "failed": len(rows) - len(ok),
        "graders": trajectory.grader_stats(ok),
        "start": start,
        "end": time.time(),
        "versions": versions,
        "generated_tokens": sum(s.get("output_tokens", 0) for s in samples),
    }
    return record, samples


def failed_eval(t: TaskRun, version: int, start: float, why: str) -> EvalRecord:
    """The record of an eval that failed as a whole (its rollout raised)."""
    return {
        "task": t.name,
        "version": version,
        "reward_mean": None,
        "samples": 0,
        "failed": len(t.eval_rows or []),
        "graders": [],
        "start": start,
        "end": time.time(),
        "versions": [],
        "error": why,
    }


def _failed(i: int, row: dict[str, Any], why: str) -> EvalSample:
    return {
        "index": i,
        "item": _plain(row),
        "prompt": "",
        "output": "",
        "reward": None,
        "grades": [],
        "error": why,
    }


def _texts(traj: dict[str, Any], tokenizer) -> tuple[str, str, int, int]:
    """The prompt and the generated text of a one-sample trajectory, and their
    token counts (none for a trajectory without tokens)."""
    if "input_ids" not in traj:
        return "", "", 0, 0
    ids = trajectory.tensor(traj["input_ids"]).flatten().tolist()
    mask = trajectory.tensor(traj["loss_mask"]).flatten().tolist()
    att = traj.get("attention_mask")  # padding, when the layout has it
    real = trajectory.tensor(att).flatten().tolist() if att is not None else mask
    pairs = [(i, m) for i, m, r in zip(ids, mask, real, strict=True) if r or m]
    prompt = [i for i, m in pairs if not m]
    output = [i for i, m in pairs if m]
    if tokenizer is None:
        return "", "", len(prompt), len(output)
    return (
        tokenizer.decode(prompt, skip_special_tokens=False),
        tokenizer.decode(output, skip_special_tokens=True),
        len(prompt),
        len(output),
    )


def _plain(row: dict[str, Any]) -> dict[str, Any]:
    """The row's JSON-able fields (loaders may add tensors or ids)."""
    return {
        k: v
        for k, v in row.items()
        if isinstance(v, str | int | float | bool | list | dict | type(None))
    }
