"""The staleness audit: does the server generate with the version it names?"""

from __future__ import annotations

from dataclasses import dataclass, field

from areal_marlaas.errors import ConfigError

# Default refusal thresholds of the mean |server - trainer| logprob gap, by the
# dtypes the two sides compute in (docs/trust.md has the measured distributions).
GAP_LIMITS = {"float32": 0.01, "other": 0.1}


@dataclass
class AuditConfig:
    """Before each update, the trainer computes (with the version's weights) the
    logprobs of the batch's generated tokens and compares them with the server's;
    the step is refused past a threshold, before the optimizer steps. The adapter
    name the server reports for every request must be the task's current one."""

    trajectories: int = field(
        default=2,
        metadata={
            "help": "Prompt groups re-scored per step by a separate forward "
            "(their every generated token) when the update's own forward cannot "
            "be read (actor.ppo_n_minibatches > 1); with one minibatch, or "
            "actor.recompute_logprob on, every group is audited at no extra cost. "
            "0 = only the adapter-name check."
        },
    )
    max_mean_gap: float | None = field(
        default=None,
        metadata={
            "help": "Refuse a step whose mean |server - trainer| logprob gap "
            "exceeds this (nats). None = by dtype: "
            f"{GAP_LIMITS['float32']} when vllm.dtype and actor.dtype are both "
            f"float32, else {GAP_LIMITS['other']}. 0 = record only."
        },
    )

    def __post_init__(self):
        if self.trajectories < 0:
            raise ConfigError(
                f"audit.trajectories must be >= 0, got {self.trajectories}."
            )
        if self.max_mean_gap is not None and self.max_mean_gap < 0:
            raise ConfigError(
                f"audit.max_mean_gap must be >= 0 (0 = record only), got "
                f"{self.max_mean_gap}."
            )

    def limit(self, server_dtype: str, trainer_dtype: str) -> float:
        if self.max_mean_gap is not None:
            return self.max_mean_gap
        both32 = server_dtype == trainer_dtype == "float32"
        return GAP_LIMITS["float32" if both32 else "other"]
