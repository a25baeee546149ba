"""A committed step's figures in the shape OpenAI's fine-tuning API documents
for a job's ``metrics`` events and checkpoints. A supervised step's are OpenAI's
flat loss and token-accuracy fields (``SUPERVISED_SCORES``), a DPO step's its
loss, preference accuracy and reward margin (``DPO_SCORES``); a reinforcement
step's are below.

``data`` holds ``step``, ``total_steps``, ``scores`` (``train_reward_mean``,
``valid_reward_mean`` on eval steps, ``graders``: one entry per grader, each
sub-grader of a ``multi`` on its own), ``usage``, ``errors`` and ``timing``;
the figures OpenAI has no name for (loss, logprob gap, queue wait, ...) sit
beside them under ``marlaas``.
"""

from __future__ import annotations

import math
from typing import Any

from areal_marlaas.rundir.records import GraderStat, StepRecord

# Error flags OpenAI's metrics name per grader; the rest count as other errors.
NAMED_ERRORS = ("sample_parse_error", "invalid_variable_error")

# Our own figures of a step, under data["marlaas"].
OWN = (
    "loss",
    "grad_norm",
    "logprob_gap_mean",
    "logprob_gap_max",
    "queue_wait_s",
    "staleness_max",
    "trained_tokens",
    "n_trajectories",
    "trainer",
)


# A supervised step's scores, as OpenAI names them (the SDK's checkpoint
# metrics); the full_* pair on the step that scored the whole validation file.
SUPERVISED_SCORES = (
    "train_loss",
    "train_mean_token_accuracy",
    "valid_loss",
    "valid_mean_token_accuracy",
    "full_valid_loss",
    "full_valid_mean_token_accuracy",
)
# A DPO step's: its preference loss under OpenAI's loss names, and the share of
# pairs ranked right and the mean reward margin (beta x log-ratio difference).
DPO_SCORES = (
    "train_loss",
    "train_preference_accuracy",
    "train_reward_margin",
    "valid_loss",
    "valid_preference_accuracy",
    "valid_reward_margin",
    "full_valid_loss",
    "full_valid_preference_accuracy",
)


def step_data(
    r: StepRecord,
    total_steps: int,
    valid: dict[str, Any] | None = None,
    eval_s: float | None = None,
) -> dict[str, Any]:
    """The ``data`` of step ``r``'s metrics event. ``valid``: the eval of this
    step, ``{"reward_mean": x, "graders": [GraderStat, ...]}``, when it ran."""
    if r.get("supervised") is not None or r.get("preference") is not None:
        return _examples_data(r, total_steps)
    graders = r.get("graders") or []
    by_name: dict[str, dict[str, Any]] = {}
    for g in graders:
        by_name[g["name"]] = {
            "name": g["name"],
            "type": g["type"],
            "train_reward_mean": g["reward_mean"],
        }
    valid_graders = (valid or {}).get("graders") or []
    for g in valid_graders:
        entry = by_name.setdefault(g["name"], {"name": g["name"], "type": g["type"]})
        entry["valid_reward_mean"] = g["reward_mean"]
    scores: dict[str, Any] = {"train_reward_mean": r.get("reward_mean")}
    if valid is not None:
        scores["valid_reward_mean"] = valid["reward_mean"]
    scores["graders"] = list(by_name.values())
    # Lines of older steps.jsonl files (a restart's reconciliation) may lack
    # fields: they count as 0.
    samples = int(r.get("n_trajectories") or 0)
    n = max(samples, 1)
    rollout_s = r.get("rollout_s") or 0.0
    train_s, wait_s = r.get("train_s") or 0.0, r.get("queue_wait_s") or 0.0
    # One iteration of this task: its batch's rollout, the wait for the
    # trainer, the step.
    full = rollout_s + wait_s + train_s
    return {
        "step": r["version"],
        "total_steps": total_steps,
        "scores": scores,
        "usage": {
            "samples": {
                "train_completion_tokens_mean": (r.get("trained_tokens") or 0) / n,
                "train_completion_tokens_count": samples,
            },
            "graders": _usage(graders, valid_graders),
        },
        "errors": {"graders": _errors(graders, valid_graders)},
        "timing": {
            "step": {
                "sampling": rollout_s,
                "training": train_s,
                "eval": eval_s,
                "full_iteration": full,
            },
            "graders": [
                {"name": g["name"], "train_execution_seconds_mean": g["seconds_mean"]}
                for g in graders
            ],
        },
        # OpenAI's Agent RFT metrics (agent jobs) and the groups discarded.
        **({"tools": dict(tools)} if (tools := r.get("tools")) else {}),
        "discarded_groups": int(r.get("discarded_groups") or 0),
        "marlaas": {
            "committed_at": r.get("t_commit"),  # to the ms: TPTS
            "train_s": train_s,
            **{k: r.get(k) for k in OWN},
        },
    }


def _examples_data(r: StepRecord, total_steps: int) -> dict[str, Any]:
    """A supervised or DPO step's event ``data``: OpenAI's flat fields
    (``train_loss``, ``train_mean_token_accuracy``, ``valid_*`` when the
    validation file was scored, ``full_valid_*`` on the step that scored all of
    it; a DPO step's preference accuracy and reward margin beside its loss)."""
    scores: dict[str, Any] = dict(r.get("supervised") or r.get("preference") or {})
    scores["train_loss"] = r.get("loss")
    keys = SUPERVISED_SCORES if r.get("supervised") is not None else DPO_SCORES
    train_s, wait_s = r.get("train_s") or 0.0, r.get("queue_wait_s") or 0.0
    return {
        "step": r["version"],
        "total_steps": total_steps,
        **{k: scores[k] for k in keys if k in scores},
        "usage": {
            "train_examples": int(r.get("n_trajectories") or 0),
            "trained_tokens": int(r.get("trained_tokens") or 0),
        },
        "timing": {"step": {"training": train_s, "full_iteration": wait_s + train_s}},
        "marlaas": {
            "committed_at": r.get("t_commit"),
            "train_s": train_s,
            **{k: r.get(k) for k in OWN},
        },
    }


def _usage(train: list[GraderStat], valid: list[GraderStat]) -> list[dict[str, Any]]:
    """Model graders' tokens per sample (graders that use none are left out)."""
    out: dict[str, dict[str, Any]] = {}
    for split, stats in (("train", train), ("valid", valid)):
        for g in stats:
            if not (g["prompt_tokens"] or g["completion_tokens"]):
                continue
            entry = out.setdefault(g["name"], {"name": g["name"], "type": g["type"]})
            n = max(g["samples"], 1)
            entry[f"{split}_prompt_tokens_mean"] = g["prompt_tokens"] / n
            entry[f"{split}_completion_tokens_mean"] = g["completion_tokens"] / n
            entry[f"{split}_count"] = g["samples"]
    return list(out.values())


def _errors(train: list[GraderStat], valid: list[GraderStat]) -> list[dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for split, stats in (("train", train), ("valid", valid)):
        for g in stats:
            entry = out.setdefault(g["name"], {"name": g["name"], "type": g["type"]})
            n = max(g["samples"], 1)
            other = sum(c for f, c in g["errors"].items() if f not in NAMED_ERRORS)
            counts = {f: g["errors"].get(f, 0) for f in NAMED_ERRORS}
            counts["other_error"] = other
            for flag, count in counts.items():
                entry[f"{split}_{flag}_count"] = count
                entry[f"{split}_{flag}_mean"] = count / n
    return list(out.values())


def estimated_finish(commit_times: list[float], steps_left: int) -> float | None:
    """The job's ETA: its newest commit plus ``steps_left`` times the mean interval
    between the given commits (None with fewer than two: no rate yet)."""
    if len(commit_times) < 2:
        return None
    rate = (commit_times[-1] - commit_times[0]) / (len(commit_times) - 1)
    return commit_times[-1] + max(steps_left, 0) * rate


def message(data: dict[str, Any]) -> str:
    """``Step N/M, train mean reward=…, full validation mean reward=…`` (a
    supervised step: ``Step N/M: training loss=…, validation loss=…``)."""
    text = f"Step {data['step']}/{data['total_steps']}"
    if "train_loss" in data:
        parts = [
            f"{label}={_fmt(data[key])}"
            for key, label in (
                ("train_loss", "training loss"),
                ("train_preference_accuracy", "preference accuracy"),
                ("valid_loss", "validation loss"),
                ("full_valid_loss", "full validation loss"),
            )
            if data.get(key) is not None
        ]
        return f"{text}: {', '.join(parts)}" if parts else text
    scores = data.get("scores") or {}
    for key, label in (
        ("train_reward_mean", "train mean reward"),
        ("valid_reward_mean", "full validation mean reward"),
    ):
        value = scores.get(key)
        if value is not None:
            text += f", {label}={_fmt(value)}"
    return text


def checkpoint_metrics(data: dict[str, Any]) -> dict[str, Any]:
    """What a checkpoint carries: its step and that step's scores, flat (the
    SDK types a checkpoint's metrics as flat numbers; extra keys pass through)."""
    if "train_loss" in data:  # a supervised or DPO step's: flat fields
        out = {"step": data["step"]}
        keys = dict.fromkeys((*SUPERVISED_SCORES, *DPO_SCORES))
        return out | {k: data[k] for k in keys if data.get(k) is not None}
    scores = data.get("scores") or {}
    out: dict[str, Any] = {"step": data["step"]}
    for key in ("train_reward_mean", "valid_reward_mean"):
        if scores.get(key) is not None:
            out[key] = scores[key]
    own = data.get("marlaas") or {}
    if own.get("loss") is not None:
        out["train_loss"] = own["loss"]
    return out


def _fmt(v: float) -> str:
    return "nan" if isinstance(v, float) and math.isnan(v) else f"{v:.4g}"
