"""The shapes of what a train step hands on: the trainer's result, and the step
record the runtime writes to ``steps.jsonl`` and passes to its listeners (the
screen, the stats logger, the service's job store)."""

from __future__ import annotations

from typing import NotRequired, TypedDict


class StepAudit(TypedDict):
    """The trainer's audit of the batch against the version it trained."""

    logprob_gap_mean: float | None  # None: nothing audited
    logprob_gap_max: float | None
    audited_tokens: int
    served_adapters: NotRequired[list[str]]  # what the server said it served


class StepProcess(TypedDict):
    page_faults: int  # fresh pages the trainer's process touched in the step


class StepPlacement(TypedDict):
    """Elastic placement (scheduler.elastic_cpus): what the step used."""

    cores_mean: float
    borrowed_s: float


class StepResult(TypedDict):
    """What ``train_task`` returns for one committed step."""

    version: int  # the task's new version (the trainer owns it)
    stats: dict[str, float]  # AReaL's stats tracker export, keys marlaas/<task>/...
    audit: StepAudit
    process: StepProcess
    placement: NotRequired[StepPlacement]


class StepRecord(TypedDict):
    """One line of ``steps.jsonl``: a committed step of one task."""

    task: str
    version: int
    reward_mean: float
    staleness_max: int  # versions between the batch's tokens and the step's
    n_trajectories: int
    trained_tokens: int
    queue_wait_s: float
    trainer: int  # the trainer worker that ran it
    train_s: float
    t_commit: float  # wall time the step committed
    loss: float | None
    grad_norm: float | None
    # The result's audit, process and placement parts:
    logprob_gap_mean: float | None
    logprob_gap_max: float | None
    audited_tokens: int
    served_adapters: NotRequired[list[str]]
    page_faults: int
    cores_mean: NotRequired[float]
    borrowed_s: NotRequired[float]
    reward_reasons: NotRequired[dict[str, int]]  # why samples scored 0
