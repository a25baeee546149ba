"""How tenant tasks share the rollout server and the trainer (``scheduler.*``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from areal.api.cli_args import SchedulerConfig

from areal_marlaas.config.cluster import RayClusterConfig, SlurmClusterConfig
from areal_marlaas.errors import ConfigError
from areal_marlaas.placement import parse_cpus
from areal_marlaas.scheduler.core import (
    CONCURRENCIES,
    MODES,
    ROLLOUT_ORDERS,
    TRAIN_ORDERS,
    Concurrency,
    Mode,
)


@dataclass
class MARLaaSSchedulerConfig(SchedulerConfig):
    """AReaL's scheduler settings (``type``: local|ray|slurm|null) plus how tenant
    tasks share the rollout server and the trainer."""

    mode: str = field(
        default="async",
        metadata={
            "help": "async: MARLaaS (tasks overlap, no global barrier); sync: "
            "multi-LoRA synchronous rounds with barriers; sequential: one task at a "
            "time, server and trainer on separate cores (Single-Disaggregated); "
            "collocated: one task at a time on shared cores (Single-Collocated).",
            "choices": list(MODES),
        },
    )
    multi_lora: bool = field(
        default=True,
        metadata={
            "help": "Batch several tasks' adapters in one server batch. false = the "
            "ablation: one task rolls out at a time."
        },
    )
    train_order: str = field(
        default="fifo",
        metadata={
            "help": "Order of the training queue. fifo: batches in the order their "
            "rollouts finished; first_steps: a task's first batch since it was "
            "submitted goes ahead of running tasks' later ones (shorter time to "
            "a newly submitted job's first step; each task jumps the queue once); "
            "fair: weighted fair share of trainer time between tenants (the "
            "tenant with the least trainer-seconds / weight goes next, FIFO "
            "within a tenant; tasks' tenant and weight, service tenants' weight).",
            "choices": list(TRAIN_ORDERS),
        },
    )
    rollout_order: str = field(
        default="fifo",
        metadata={
            "help": "How the rollout server orders tenants' requests. fifo: first "
            "come, first served; fair: each rollout's requests carry their "
            "tenant's generated tokens / weight as vLLM priority (the least "
            "served tenant first), so one tenant's huge batch does not hold back "
            "the others' rollouts; the server runs --scheduling-policy priority "
            "(a server in server.addresses must be started so).",
            "choices": list(ROLLOUT_ORDERS),
        },
    )
    concurrency: str = field(
        default="off",
        metadata={
            "help": "How many tasks are in the loop (rolling out, queued for or "
            "on the trainer, publishing) at once. off: as many as KV admission "
            "allows; adaptive (mode async): a task that has not started enters "
            "only while the tasks in the loop offer the trainers less than "
            "target_load x trainers (each task's load = its step seconds / its "
            "whole cycle's, measured online); past that point another task adds "
            "a step to every task's cycle and buys no throughput. Waiting tasks "
            "are held 'load' in admission order (the service keeps their jobs "
            "queued, with their position and an estimated start).",
            "choices": list(CONCURRENCIES),
        },
    )
    target_load: float = field(
        default=1.0,
        metadata={
            "help": "concurrency=adaptive: the summed load (1.0 = one trainer "
            "always busy) per trainer up to which new tasks enter. Higher keeps "
            "the trainers busier through rollout-time noise at the cost of a "
            "longer wait in the training queue (time to first step); lower the "
            "opposite."
        },
    )
    trainers: int = field(
        default=1,
        metadata={
            "help": "Trainer workers, each a whole FSDP engine with its own AReaL "
            "role (actor, actor1, ...). A task is placed on the worker holding the "
            "fewest tasks when it arrives and trains only there (its optimizer "
            "state lives there); a free worker takes the first queued batch placed "
            "on it. >1 needs scheduler.type=local|ray|slurm; local workers share "
            "this machine's cores equally.",
        },
    )
    max_concurrent_rollouts: int = field(
        default=0,
        metadata={"help": "Most tasks rolling out at once; 0 = no cap."},
    )
    kv_budget_bytes: int = field(
        default=0,
        metadata={
            "help": "KV-cache bytes the rolling-out tasks may use together; "
            "0 = kv_budget_fraction of the server's KV capacity."
        },
    )
    kv_budget_fraction: float = field(
        default=1.0,
        metadata={
            "help": "Budget as a fraction of the server's KV capacity (read from the "
            "server at start) when kv_budget_bytes is 0."
        },
    )
    kv_live: bool = field(
        default=False,
        metadata={
            "help": "Also poll the server's vllm:kv_cache_usage_perc and admit "
            "against max(estimate, reported usage)."
        },
    )
    kv_poll_interval_s: float = field(
        default=1.0, metadata={"help": "Seconds between KV usage polls (kv_live)."}
    )
    task_retries: int = field(
        default=0,
        metadata={
            "help": "Retries of a task's failed rollout, training step or publish "
            "at one version before the task is marked failed."
        },
    )
    trainer_cpus: str = field(
        default="",
        metadata={
            "help": "CPU cores of the in-process trainer (e.g. '1' or '2-3'); "
            "empty = no pinning."
        },
    )
    elastic_cpus: str = field(
        default="",
        metadata={
            "help": "Elastic placement: cores the in-process trainer borrows while "
            "no rollout is in flight (e.g. the server's cores) and gives back when "
            "one starts; needs trainer_cpus and scheduler.type=null. Empty = off."
        },
    )
    startup_timeout_s: float = field(
        default=120.0,
        metadata={
            "help": "scheduler.type=ray|slurm: seconds the workers may take to be "
            "placed and to answer (AReaL's startup_timeout). Raise it when Slurm "
            "jobs queue."
        },
    )
    ray: RayClusterConfig = field(
        default_factory=RayClusterConfig,
        metadata={"help": "scheduler.type=ray: the cluster and start-up checks."},
    )
    slurm: SlurmClusterConfig = field(
        default_factory=SlurmClusterConfig,
        metadata={"help": "scheduler.type=slurm: how workers are started."},
    )

    def __post_init__(self):
        parent = getattr(super(), "__post_init__", None)
        if parent is not None:
            parent()
        if self.mode not in MODES:
            raise ConfigError(
                f"scheduler.mode must be one of {list(MODES)}, got {self.mode!r}."
            )
        if self.train_order not in TRAIN_ORDERS:
            raise ConfigError(
                f"scheduler.train_order must be one of {list(TRAIN_ORDERS)}, got "
                f"{self.train_order!r}."
            )
        if self.rollout_order not in ROLLOUT_ORDERS:
            raise ConfigError(
                f"scheduler.rollout_order must be one of {list(ROLLOUT_ORDERS)}, "
                f"got {self.rollout_order!r}."
            )
        if self.concurrency not in CONCURRENCIES:
            raise ConfigError(
                f"scheduler.concurrency must be one of {list(CONCURRENCIES)}, got "
                f"{self.concurrency!r}."
            )
        adaptive = Concurrency(self.concurrency) is Concurrency.ADAPTIVE
        if adaptive and Mode(self.mode) is not Mode.ASYNC:
            raise ConfigError(
                f"scheduler.concurrency=adaptive limits the async loop; with "
                f"scheduler.mode={self.mode} set scheduler.concurrency=off."
            )
        if not self.target_load > 0:
            raise ConfigError(
                f"scheduler.target_load must be > 0 (1.0 = the trainers just "
                f"saturated), got {self.target_load}."
            )
        if self.trainers < 1:
            raise ConfigError(f"scheduler.trainers must be >= 1, got {self.trainers}.")
        if self.trainers > 1 and self.type is None:
            raise ConfigError(
                f"scheduler.trainers={self.trainers} runs trainer workers: set "
                "scheduler.type=local (or ray|slurm), or scheduler.trainers=1 for "
                "the in-process trainer."
            )
        if self.max_concurrent_rollouts < 0:
            raise ConfigError(
                "scheduler.max_concurrent_rollouts must be >= 0 (0 = no cap), got "
                f"{self.max_concurrent_rollouts}."
            )
        if self.kv_budget_bytes < 0:
            raise ConfigError(
                "scheduler.kv_budget_bytes must be >= 0 (0 = from the server), got "
                f"{self.kv_budget_bytes}."
            )
        if not 0 < self.kv_budget_fraction <= 1:
            raise ConfigError(
                "scheduler.kv_budget_fraction must be in (0, 1], got "
                f"{self.kv_budget_fraction}."
            )
        if self.kv_poll_interval_s <= 0:
            raise ConfigError("scheduler.kv_poll_interval_s must be > 0.")
        if self.task_retries < 0:
            raise ConfigError(
                f"scheduler.task_retries must be >= 0, got {self.task_retries}."
            )
        own = parse_cpus(self.trainer_cpus, "scheduler.trainer_cpus")
        borrow = parse_cpus(self.elastic_cpus, "scheduler.elastic_cpus")
        if borrow and not own:
            raise ConfigError(
                "scheduler.elastic_cpus needs scheduler.trainer_cpus (the cores the "
                "trainer keeps while rollouts run), e.g. trainer_cpus=1 "
                "elastic_cpus=0."
            )
        if borrow and self.type is not None:
            raise ConfigError(
                "scheduler.elastic_cpus resizes the in-process trainer only: set "
                f"scheduler.type=null (got {self.type!r}) or drop elastic_cpus."
            )
        if borrow & own:
            raise ConfigError(
                f"scheduler.elastic_cpus={self.elastic_cpus!r} overlaps "
                f"scheduler.trainer_cpus={self.trainer_cpus!r}: give only the cores "
                "to borrow (the rollout server's)."
            )
        if self.type not in (None, "local", "ray", "slurm"):
            raise ConfigError(
                f"scheduler.type must be local|ray|slurm|null, got {self.type!r}."
            )
        if self.startup_timeout_s <= 0:
            raise ConfigError(
                "scheduler.startup_timeout_s must be > 0, got "
                f"{self.startup_timeout_s}."
            )

    @property
    def max_rolling(self) -> int | None:
        """Tasks that may roll out at once (None = no cap)."""
        caps = [self.max_concurrent_rollouts] if self.max_concurrent_rollouts else []
        if not self.multi_lora:
            caps.append(1)
        return min(caps) if caps else None
