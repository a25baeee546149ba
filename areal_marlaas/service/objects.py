"""Stored rows -> the JSON objects of OpenAI's API (field names as in the official
SDK's ``FineTuningJob``, ``FineTuningJobEvent``, ``FineTuningJobCheckpoint``,
``FileObject``, ``Model``, the evals API's ``Eval``, ``EvalRun`` and
``OutputItem``), plus a few fields of ours (``steps_done``, ``steps_total``,
``ttfs_s``, ``pending_action``, a run's ``reward_mean`` and ``step``)."""

from __future__ import annotations

from typing import Any

from areal_marlaas.service.tables import (
    Checkpoint,
    EvalOutputItem,
    EvalRecord,
    EvalRun,
    Event,
    File,
    Job,
)
from areal_marlaas.service.validation import public_method

# The supervised-style summary the SDK's `FineTuningJob.hyperparameters` declares.
_SUMMARY = ("batch_size", "learning_rate_multiplier", "n_epochs")


def _ts(t: float | None) -> int | None:
    return None if t is None else int(t)


def job_usage(job: Job) -> dict[str, Any]:
    """What the job used so far (summed over its committed steps and evals)."""
    return {
        "trainer_s": job.trainer_s or 0.0,
        "generated_tokens": job.generated_tokens or 0,
        "trained_tokens": job.trained_tokens or 0,
        "eval_tokens": job.eval_tokens or 0,
    }


def job_object(job: Job, pending: list[str] | None = None) -> dict[str, Any]:
    hp = dict(job.hyperparameters or {})
    return {
        "id": job.id,
        "object": "fine_tuning.job",
        "created_at": int(job.created_at),
        "finished_at": _ts(job.finished_at),
        "estimated_finish": _ts(job.estimated_finish),
        "status": job.status,
        "model": job.model,
        "fine_tuned_model": job.fine_tuned_model,
        "organization_id": job.tenant_id,
        "training_file": job.training_file,
        "validation_file": job.validation_file,
        "result_files": list(job.result_files or []),
        "trained_tokens": job.trained_tokens,
        "seed": job.seed,
        # All resolved values, the SDK's three first (extra keys parse fine).
        "hyperparameters": {**{k: hp.get(k) for k in _SUMMARY}, **hp},
        "method": public_method(job.method),
        "metadata": job.metadata_,
        "error": job.error,
        "integrations": None,
        "user_provided_suffix": job.suffix,
        "steps_done": job.steps_done,
        "steps_total": job.steps_total,
        "started_at": _ts(job.started_at),
        "ttfs_s": job.ttfs_s,
        "usage": job_usage(job),
        # Its validation runs (client.evals), when it has a validation file.
        "eval_id": job.eval_id,
        # The newest cancel/pause/resume the scheduler has not applied yet.
        "pending_action": pending[-1] if pending else None,
    }


def event_id(e: Event) -> str:
    return f"ftevent-{e.id}"


def event_object(e: Event) -> dict[str, Any]:
    return {
        "id": event_id(e),
        "object": "fine_tuning.job.event",
        "created_at": int(e.created_at),
        "level": e.level,
        "message": e.message,
        "type": e.type,
        "data": e.data or {},
    }


def checkpoint_object(c: Checkpoint) -> dict[str, Any]:
    return {
        "id": c.id,
        "object": "fine_tuning.job.checkpoint",
        "created_at": int(c.created_at),
        "fine_tuned_model_checkpoint": c.fine_tuned_model_checkpoint,
        "fine_tuning_job_id": c.job_id,
        "step_number": c.step_number,
        "metrics": c.metrics or {},
    }


def file_object(f: File) -> dict[str, Any]:
    return {
        "id": f.id,
        "object": "file",
        "bytes": f.bytes,
        "created_at": int(f.created_at),
        "filename": f.filename,
        "purpose": f.purpose,
        "status": "processed",
        "expires_at": None,
        "status_details": None,
    }


def model_object(model_id: str, created: float, owned_by: str) -> dict[str, Any]:
    return {
        "id": model_id,
        "object": "model",
        "created": int(created),
        "owned_by": owned_by,
    }


def list_object(data: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    """A cursor page: the SDK asks for the next one with ``after=<last id>``."""
    return {
        "object": "list",
        "data": data,
        "has_more": has_more,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
    }


def eval_object(ev: EvalRecord) -> dict[str, Any]:
    return {
        "id": ev.id,
        "object": "eval",
        "created_at": int(ev.created_at),
        "name": ev.name,
        "metadata": {"fine_tuning_job_id": ev.job_id},
        "data_source_config": {
            "type": "custom",
            "schema": {"type": "object", "properties": {"messages": {}}},
        },
        "testing_criteria": ev.testing_criteria,
    }


def eval_run_object(run: EvalRun, validation_file: str | None) -> dict[str, Any]:
    result = dict(run.result)
    error = result.pop("error", None) or {"code": "", "message": ""}
    return {
        "id": run.id,
        "object": "eval.run",
        "created_at": int(run.created_at),
        "eval_id": run.eval_id,
        "name": f"step {run.step}",
        "model": run.model,
        "status": run.status,
        "metadata": {"step": str(run.step)},
        "data_source": {
            "type": "jsonl",
            "source": {"type": "file_id", "id": validation_file or ""},
        },
        "error": error,
        "per_model_usage": [],
        "report_url": "",
        "step": run.step,
        **result,
    }


def output_item_object(item: EvalOutputItem) -> dict[str, Any]:
    return {
        "id": item.id,
        "object": "eval.run.output_item",
        "created_at": int(item.created_at),
        "eval_id": item.eval_id,
        "run_id": item.run_id,
        "datasource_item_id": item.datasource_item_id,
        "status": item.status,
        **item.body,
    }
