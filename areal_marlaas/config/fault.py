"""Fault-tolerance settings: rollout-server supervision, tenant guards, retention.

One dataclass, ``MARLaaSConfig.fault``; override e.g. ``fault.keep_adapters=3``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from areal_marlaas.errors import ConfigError


@dataclass
class FaultToleranceConfig:
    """How a run survives a dead rollout server and keeps tenants apart."""

    supervise_server: bool = field(
        default=True,
        metadata={
            "help": "Health-check a launched vLLM server and restart it (same port, "
            "every task's current adapter reloaded) when it dies or hangs. "
            "Attached servers (server.addresses) are not supervised."
        },
    )
    health_interval_s: float = field(
        default=5.0, metadata={"help": "Seconds between /health checks."}
    )
    health_timeout_s: float = field(
        default=10.0, metadata={"help": "A /health call slower than this is a miss."}
    )
    health_failures: int = field(
        default=3,
        metadata={
            "help": "Consecutive missed /health checks that declare the server hung "
            "(a process exit is detected at the next check)."
        },
    )
    restart_limit: int = field(
        default=3,
        metadata={
            "help": "Server restarts allowed per run; past it the run's rollouts "
            "fail (and their tasks with them)."
        },
    )
    restart_wait_s: float = field(
        default=900.0,
        metadata={
            "help": "Longest a rollout or publish waits for a restarting server "
            "before it fails."
        },
    )
    reward_timeout_s: float = field(
        default=30.0,
        metadata={
            "help": "Default per-call reward timeout (tasks[i].reward_timeout_s "
            "overrides it); a call past it is killed and fails its episode."
        },
    )
    reward_workers: int = field(
        default=2,
        metadata={"help": "Processes per task that compute rewards (isolated)."},
    )
    keep_adapters: int = field(
        default=0,
        metadata={
            "help": "Committed adapter versions kept on disk per task (the newest "
            "K, plus the one being served). 0 = keep all."
        },
    )

    save_retries: int = field(
        default=2,
        metadata={
            "help": "Retries (1 s, 2 s, ... backoff) of a failed adapter/optimizer "
            "save after a successful train step. The engine already holds the new "
            "version, so the save is retried in place, not the step."
        },
    )
    deterministic: bool = field(
        default=False,
        metadata={
            "help": "Reproducible runs: every rollout request gets a vLLM seed "
            "derived from (tasks[i].seed, adapter version, prompt tokens, sample "
            "index), and the trainer recomputes the old logprobs "
            "(actor.recompute_logprob is set) so the loss does not see the "
            "server's batch-dependent rounding. A run resumed after a crash then "
            "commits bitwise the adapters an uninterrupted run commits. Costs one "
            "extra trainer forward pass per step; vLLM samples seeded requests "
            "one by one (a per-request loop on GPU)."
        },
    )

    def __post_init__(self):
        positive = {
            "health_interval_s": self.health_interval_s,
            "health_timeout_s": self.health_timeout_s,
            "health_failures": self.health_failures,
            "restart_wait_s": self.restart_wait_s,
            "reward_timeout_s": self.reward_timeout_s,
            "reward_workers": self.reward_workers,
        }
        for key, value in positive.items():
            if not value > 0:
                raise ConfigError(f"fault.{key} must be > 0, got {value}.")
        if self.restart_limit < 0:
            raise ConfigError(
                f"fault.restart_limit must be >= 0, got {self.restart_limit}."
            )
        if self.save_retries < 0:
            raise ConfigError(
                f"fault.save_retries must be >= 0, got {self.save_retries}."
            )
        if self.keep_adapters < 0:
            raise ConfigError(
                f"fault.keep_adapters must be >= 0 (0 = keep all), got "
                f"{self.keep_adapters}."
            )
