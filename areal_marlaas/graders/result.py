"""Grading results, shaped like the OpenAI SDK's ``GraderRunResponse``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NotRequired, TypedDict

# MetadataErrors' boolean flags, as the SDK names them on the wire.
ERROR_FLAGS = (
    "formula_parse_error",
    "invalid_variable_error",
    "model_grader_parse_error",
    "model_grader_refusal_error",
    "model_grader_server_error",
    "other_error",
    "python_grader_runtime_error",
    "python_grader_server_error",
    "sample_parse_error",
    "truncated_observation_error",
    "unresponsive_reward_error",
)
DETAIL_FIELDS = (
    "model_grader_server_error_details",
    "python_grader_runtime_error_details",
    "python_grader_server_error_type",
)


def empty_errors() -> dict[str, Any]:
    errors: dict[str, Any] = {flag: False for flag in ERROR_FLAGS}
    errors.update({name: None for name in DETAIL_FIELDS})
    return errors


@dataclass
class LeafResult:
    """One non-multi grader on one sample."""

    score: float = 0.0
    # Error flag (one of ERROR_FLAGS) -> message; empty when graded cleanly.
    errors: dict[str, str] = field(default_factory=dict)
    details: dict[str, str] = field(default_factory=dict)  # DETAIL_FIELDS
    token_usage: dict[str, int] | None = None  # prompt/completion/total tokens
    sampled_model_name: str | None = None
    seconds: float = 0.0

    @classmethod
    def fail(cls, flag: str, message: str, **details: str) -> LeafResult:
        return cls(0.0, {flag: message}, dict(details))


class GraderGrade(TypedDict):
    """One grader's verdict on one sample, as a trajectory carries it."""

    name: str  # the grader's name (a multi's sub-grader: its key)
    type: str
    score: float
    errors: list[str]  # the ERROR_FLAGS it raised
    seconds: float
    prompt_tokens: NotRequired[int]  # a model grader's usage
    completion_tokens: NotRequired[int]


@dataclass
class GraderResult:
    reward: float
    sub_rewards: dict[str, float]
    metadata: dict[str, Any]
    token_usage_per_model: dict[str, dict[str, int]] = field(default_factory=dict)
    # One entry per grader that scored the sample (each sub-grader of a multi,
    # else the grader itself): what a step's metrics report per grader.
    per_grader: list[GraderGrade] = field(default_factory=list)

    @property
    def errors(self) -> dict[str, Any]:
        return self.metadata["errors"]

    @property
    def reason(self) -> str:
        """Why the grading failed ("" when it had no error)."""
        messages = self.metadata["errors"].get("messages") or {}
        return "; ".join(f"{k}: {v}" for k, v in messages.items())

    def to_dict(self) -> dict[str, Any]:
        """The ``/fine_tuning/alpha/graders/run`` response body."""
        return {
            "reward": self.reward,
            "sub_rewards": dict(self.sub_rewards),
            "metadata": self.metadata,
            "model_grader_token_usage_per_model": self.token_usage_per_model,
        }
