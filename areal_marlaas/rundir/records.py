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


class SupervisedScore(TypedDict):
    """A supervised step's scores (OpenAI's fine-tuning metrics): on the
    trained batch (before the step) and, when validation examples came with it,
    on those (after the step)."""

    train_mean_token_accuracy: float | None
    trained_tokens: int
    valid_loss: NotRequired[float | None]
    valid_mean_token_accuracy: NotRequired[float | None]
    valid_tokens: NotRequired[int]
    # The last step's validation covers every validation example.
    full_valid_loss: NotRequired[float | None]
    full_valid_mean_token_accuracy: NotRequired[float | None]


class PreferenceScore(TypedDict):
    """A DPO step's scores: the share of pairs whose implicit reward ranks the
    preferred output first, and the mean reward margin (beta x log-ratio
    difference), on the trained pairs (before the step) and, when validation
    pairs came with it, on those (after the step)."""

    train_preference_accuracy: float | None
    train_reward_margin: float | None
    trained_pairs: int
    valid_loss: NotRequired[float | None]
    valid_preference_accuracy: NotRequired[float | None]
    valid_reward_margin: NotRequired[float | None]
    valid_pairs: NotRequired[int]
    full_valid_loss: NotRequired[float | None]
    full_valid_preference_accuracy: NotRequired[float | None]


class StepResult(TypedDict):
    """What ``train_task`` returns for one committed step."""

    version: int  # the task's new version (the trainer owns it)
    loss: float | None  # the step's objective on its batch
    grad_norm: float | None
    stats: dict[str, float]  # AReaL's stats tracker export, keys marlaas/<task>/...
    audit: StepAudit
    process: StepProcess
    placement: NotRequired[StepPlacement]
    supervised: NotRequired[SupervisedScore]  # supervised tasks
    preference: NotRequired[PreferenceScore]  # DPO tasks


class GraderStat(TypedDict):
    """One grader over a step's batch (a multi grader: each sub-grader)."""

    name: str
    type: str
    reward_mean: float
    samples: int
    errors: dict[str, int]  # error flag -> samples that raised it
    seconds_mean: float
    prompt_tokens: int  # a model grader's usage, summed over the samples
    completion_tokens: int


class StepRecord(TypedDict):
    """One line of ``steps.jsonl``: a committed step of one task."""

    task: str
    version: int
    reward_mean: float | None  # None: a method without rewards (supervised)
    staleness_max: int  # versions between the batch's tokens and the step's
    n_trajectories: int
    trained_tokens: int
    rollout_s: float  # the batch's rollout, start to last episode
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
    graders: NotRequired[list[GraderStat]]  # tasks with a grader
    # Groups of the batch whose rollout was discarded or failed (not trained on).
    discarded_groups: NotRequired[int]
    tools: NotRequired[ToolUse]  # tool-agent tasks
    supervised: NotRequired[SupervisedScore]  # supervised tasks
    preference: NotRequired[PreferenceScore]  # DPO tasks


class ToolUse(TypedDict):
    """A batch's tool calls (OpenAI's Agent RFT step metrics)."""

    rollouts: int
    calls: int  # the model's calls, each counted once
    sent: int  # of them, those sent to an endpoint (known tool, parsed)
    calls_per_rollout: float
    tokens_per_call: float  # tokens the tool messages added, per call
    latency_s_mean: float  # one call's execution time, retries included
    errors: int  # calls the model saw an error for (4xx, timeout, 413, ...)
    turns_mean: float


class EvalSample(TypedDict):
    """One held-out row of an eval: what the adapter wrote and how it scored."""

    index: int  # the row's position in the task's eval rows
    item: dict  # the row as the dataset gave it
    prompt: str
    output: str
    reward: float | None  # None: the episode failed
    grades: list[dict]  # GraderGrade per grader (tasks with a grader)
    error: NotRequired[str]
    prompt_tokens: NotRequired[int]
    output_tokens: NotRequired[int]  # what the adapter generated
    conversation: NotRequired[list[dict]]  # a tool agent's turns and tool calls


class EvalRecord(TypedDict):
    """One line of ``evals.jsonl``: a held-out eval of a committed version."""

    task: str
    version: int
    reward_mean: float | None  # over the samples that came back; None: none did
    samples: int
    failed: int  # episodes that failed (not in reward_mean)
    graders: list[GraderStat]
    start: float
    end: float
    versions: list[int]  # adapter versions that generated it (one, normally)
    generated_tokens: NotRequired[int]  # over every sample that came back
    error: NotRequired[str]  # the eval failed as a whole
