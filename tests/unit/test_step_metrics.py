"""A committed step's metrics in OpenAI's shape, from a batch's grades."""

from __future__ import annotations

import pytest
import torch
from openai._models import construct_type
from openai.types.fine_tuning import FineTuningJobEvent
from openai.types.fine_tuning.jobs import FineTuningJobCheckpoint

from areal_marlaas import trajectory
from areal_marlaas.rundir.records import StepRecord
from areal_marlaas.service import step_metrics


def traj(reward: float, grades: list[dict]) -> dict:
    return {"rewards": torch.tensor([reward]), "grades": grades}


def g(name: str, score: float, *errors: str, type="string_check", **tokens) -> dict:
    return {
        "name": name,
        "type": type,
        "score": score,
        "errors": list(errors),
        "seconds": 0.5,
        **tokens,
    }


BATCH = [
    traj(1.0, [g("exact", 1.0), g("judge", 0.5, type="score_model", prompt_tokens=10)]),
    traj(0.0, [g("exact", 0.0, "sample_parse_error"), g("judge", 0.0, "other_error")]),
    traj(0.5, [g("exact", 0.0, "invalid_variable_error"), g("judge", 1.0)]),
    traj(0.5, [g("exact", 1.0), g("judge", 0.5, "model_grader_server_error")]),
]


def record(**over) -> StepRecord:
    r: StepRecord = {
        "task": "t",
        "version": 3,
        "reward_mean": 0.5,
        "staleness_max": 0,
        "n_trajectories": 4,
        "trained_tokens": 40,
        "rollout_s": 2.0,
        "queue_wait_s": 0.5,
        "trainer": 0,
        "train_s": 1.5,
        "t_commit": 1000.0,
        "loss": 0.1,
        "grad_norm": 1.0,
        "logprob_gap_mean": 0.01,
        "logprob_gap_max": 0.02,
        "audited_tokens": 40,
        "page_faults": 0,
        "graders": trajectory.grader_stats(BATCH),
    }
    r.update(over)  # type: ignore[typeddict-item]
    return r


def test_grader_stats_mean_counts_and_tokens_per_grader():
    stats = {s["name"]: s for s in trajectory.grader_stats(BATCH)}
    assert stats["exact"]["reward_mean"] == 0.5 and stats["exact"]["samples"] == 4
    assert stats["exact"]["errors"] == {
        "sample_parse_error": 1,
        "invalid_variable_error": 1,
    }
    assert stats["judge"]["reward_mean"] == 0.5
    assert stats["judge"]["prompt_tokens"] == 10
    assert trajectory.grader_stats([traj(1.0, [])]) == []


def test_step_data_has_openai_scores_errors_timing_and_our_own_key():
    data = step_metrics.step_data(record(), total_steps=5)
    assert (data["step"], data["total_steps"]) == (3, 5)
    scores = data["scores"]
    assert scores["train_reward_mean"] == 0.5 and "valid_reward_mean" not in scores
    assert scores["graders"] == [
        {"name": "exact", "type": "string_check", "train_reward_mean": 0.5},
        {"name": "judge", "type": "score_model", "train_reward_mean": 0.5},
    ]
    errors = {e["name"]: e for e in data["errors"]["graders"]}
    assert errors["exact"]["train_sample_parse_error_count"] == 1
    assert errors["exact"]["train_invalid_variable_error_mean"] == 0.25
    assert errors["exact"]["train_other_error_count"] == 0
    # Every other flag counts as an other error.
    assert errors["judge"]["train_other_error_count"] == 2
    assert data["usage"]["graders"] == [
        {
            "name": "judge",
            "type": "score_model",
            "train_prompt_tokens_mean": 2.5,
            "train_completion_tokens_mean": 0.0,
            "train_count": 4,
        }
    ]
    assert data["usage"]["samples"]["train_completion_tokens_mean"] == 10.0
    assert data["timing"]["step"] == {
        "sampling": 2.0,
        "training": 1.5,
        "eval": None,
        "full_iteration": 4.0,
    }
    own = data["marlaas"]
    assert (own["committed_at"], own["loss"], own["queue_wait_s"]) == (1000.0, 0.1, 0.5)
    assert "loss" not in data and "reward_mean" not in data


def test_a_validation_adds_valid_scores_per_grader_and_to_the_message():
    valid = {
        "reward_mean": 0.75,
        "graders": [
            {
                "name": "exact",
                "type": "string_check",
                "reward_mean": 0.75,
                "samples": 4,
                "errors": {},
                "seconds_mean": 0.1,
                "prompt_tokens": 0,
                "completion_tokens": 0,
            }
        ],
    }
    data = step_metrics.step_data(record(), 5, valid=valid, eval_s=3.0)
    assert data["scores"]["valid_reward_mean"] == 0.75
    exact = data["scores"]["graders"][0]
    assert (exact["train_reward_mean"], exact["valid_reward_mean"]) == (0.5, 0.75)
    assert data["timing"]["step"]["eval"] == 3.0
    assert step_metrics.message(data) == (
        "Step 3/5, train mean reward=0.5, full validation mean reward=0.75"
    )


def test_message_and_checkpoint_without_a_validation():
    data = step_metrics.step_data(record(reward_mean=0.25), 5)
    assert step_metrics.message(data) == "Step 3/5, train mean reward=0.25"
    assert step_metrics.checkpoint_metrics(data) == {
        "step": 3,
        "train_reward_mean": 0.25,
        "train_loss": 0.1,
    }


def test_the_sdk_parses_the_event_and_the_checkpoint():
    data = step_metrics.step_data(record(), 5)
    event = construct_type(
        type_=FineTuningJobEvent,
        value={
            "id": "ftevent-1",
            "created_at": 1,
            "level": "info",
            "message": step_metrics.message(data),
            "object": "fine_tuning.job.event",
            "type": "metrics",
            "data": data,
        },
    )
    assert isinstance(event, FineTuningJobEvent)
    assert event.data["scores"]["train_reward_mean"] == pytest.approx(0.5)
    ckpt = construct_type(
        type_=FineTuningJobCheckpoint,
        value={
            "id": "ftckpt-1",
            "created_at": 1,
            "fine_tuned_model_checkpoint": "ft:x:ckpt-step-3",
            "fine_tuning_job_id": "ftjob-1",
            "object": "fine_tuning.job.checkpoint",
            "step_number": 3,
            "metrics": step_metrics.checkpoint_metrics(data),
        },
    )
    assert isinstance(ckpt, FineTuningJobCheckpoint)
    assert ckpt.metrics.step == 3 and ckpt.metrics.train_loss == pytest.approx(0.1)
    assert ckpt.metrics.train_reward_mean == pytest.approx(0.5)  # type: ignore[attr-defined]


def test_the_estimated_finish_extrapolates_the_mean_commit_interval():
    assert step_metrics.estimated_finish([100.0], 4) is None  # no rate yet
    assert step_metrics.estimated_finish([100.0, 110.0, 130.0], 3) == 130.0 + 3 * 15.0
    assert step_metrics.estimated_finish([100.0, 110.0], 0) == 110.0


def supervised_record(**scores) -> StepRecord:
    return record(
        reward_mean=None,
        loss=0.8,
        graders=None,
        supervised={"train_mean_token_accuracy": 0.6, "trained_tokens": 40, **scores},
    )


def test_a_supervised_step_has_openais_loss_fields_and_message():
    data = step_metrics.step_data(supervised_record(valid_loss=0.9), total_steps=5)

    assert data["train_loss"] == 0.8 and data["train_mean_token_accuracy"] == 0.6
    assert data["valid_loss"] == 0.9 and "full_valid_loss" not in data
    assert "scores" not in data  # a reinforcement step's rewards
    assert step_metrics.message(data) == (
        "Step 3/5: training loss=0.8, validation loss=0.9"
    )


def test_the_sdk_types_a_supervised_checkpoints_metrics():
    data = step_metrics.step_data(
        supervised_record(
            valid_loss=0.9,
            valid_mean_token_accuracy=0.5,
            full_valid_loss=0.95,
            full_valid_mean_token_accuracy=0.55,
        ),
        5,
    )
    ckpt = construct_type(
        type_=FineTuningJobCheckpoint,
        value={
            "id": "ftckpt-1",
            "created_at": 1,
            "fine_tuned_model_checkpoint": "ft:x:ckpt-step-3",
            "fine_tuning_job_id": "ftjob-1",
            "object": "fine_tuning.job.checkpoint",
            "step_number": 3,
            "metrics": step_metrics.checkpoint_metrics(data),
        },
    )
    assert isinstance(ckpt, FineTuningJobCheckpoint)
    m = ckpt.metrics
    assert (m.step, m.train_loss, m.train_mean_token_accuracy) == (3, 0.8, 0.6)
    assert (m.valid_loss, m.valid_mean_token_accuracy) == (0.9, 0.5)
    assert (m.full_valid_loss, m.full_valid_mean_token_accuracy) == (0.95, 0.55)
