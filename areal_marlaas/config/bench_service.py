"""``marlaas bench-service`` settings: the ``load:`` section beside a service
config (docs/bench.md#service-under-load)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from areal_marlaas.config.service import ServiceRunConfig
from areal_marlaas.errors import ConfigError

# service kind -> what it sets on the service it starts. `fifo` is one job at a
# time in arrival order (what a one-job-per-run platform gives a queue of
# tenants); `async` runs them all at once on the shared trainer, its training
# queue in FIFO order; `async_first` also trains each job's first batch ahead of
# running jobs' later ones (scheduler.train_order=first_steps); `fair` shares the
# trainer and the server between tenants by weight (scheduler.train_order=fair,
# scheduler.rollout_order=fair); `fair_adaptive` also lets in only the jobs that
# saturate the trainer (scheduler.concurrency=adaptive), the others queued.
SERVICES = ("async", "async_first", "fair", "fair_adaptive", "fifo")
GRADERS = ("string_check", "text_similarity")


@dataclass
class TenantLoad:
    """One tenant of ``load.tenants``: its weight and the size of its jobs."""

    name: str = field(
        default="", metadata={"help": "Its name (created in the service's store)."}
    )
    weight: float = field(
        default=1.0,
        metadata={"help": "Its share weight (marlaas service tenant add --weight)."},
    )
    jobs: int = field(default=1, metadata={"help": "Jobs it sends per run."})
    batch_size: int = field(
        default=0,
        metadata={
            "help": "Its jobs' batch_size (0: load.batch_size); their lines scale "
            "with it, so every job has the same number of steps."
        },
    )
    compute_multiplier: float = field(
        default=0.0,
        metadata={"help": "Its jobs' compute_multiplier (0: load.compute_multiplier)."},
    )
    tool_latency_s: float = field(
        default=0.0,
        metadata={
            "help": "> 0: an agentic tenant: its jobs are Agent RFT jobs of the "
            "secret-code lookup (bench/lookup_task.py) whose search tool, a "
            "marlaas search-server the bench starts, answers after this median "
            "latency (log-normal, sigma 0.5); 0: single-turn arithmetic jobs."
        },
    )

    def __post_init__(self):
        where = f"load.tenants[{self.name or '?'}]"
        if not (self.tool_latency_s >= 0 and math.isfinite(self.tool_latency_s)):
            raise ConfigError(
                f"{where}.tool_latency_s must be >= 0 (0: no tools), got "
                f"{self.tool_latency_s}."
            )
        if not self.name:
            raise ConfigError("load.tenants: every tenant needs a name.")
        if not (self.weight > 0 and math.isfinite(self.weight)):
            raise ConfigError(f"{where}.weight must be > 0, got {self.weight}.")
        if not isinstance(self.jobs, int) or self.jobs < 1:
            raise ConfigError(f"{where}.jobs must be an integer >= 1, got {self.jobs}.")
        if self.batch_size < 0 or self.compute_multiplier < 0:
            raise ConfigError(
                f"{where}.batch_size and .compute_multiplier must be >= 0 (0: the "
                "load's), got {self.batch_size} and {self.compute_multiplier}."
            )


@dataclass
class ServiceLoadConfig:
    """What ``marlaas bench-service`` sends: ``jobs`` fine-tuning jobs arriving as
    a Poisson process, through the official ``openai`` SDK."""

    jobs: int = field(
        default=8,
        metadata={
            "help": "Jobs per run, sent by one tenant (when load.tenants is empty)."
        },
    )
    tenants: list[TenantLoad] = field(
        default_factory=list,
        metadata={
            "help": "Tenants that send the jobs instead, each with its weight, "
            "job count and job size; their jobs arrive mixed in one Poisson "
            "process (a seeded shuffle, the same for every service)."
        },
    )
    rates_per_min: list[float] = field(
        default_factory=lambda: [2.0, 6.0],
        metadata={"help": "Poisson arrival rates, jobs per minute (one run each)."},
    )
    services: list[str] = field(
        default_factory=lambda: ["async", "fifo"],
        metadata={
            "help": "Services compared: async (every job runs at once on the "
            "shared trainer, training queue in FIFO order), async_first (the "
            "same, each job's first batch trained first: "
            "scheduler.train_order=first_steps), fair (the same, trainer and "
            "server shared by tenant weight: scheduler.train_order=fair, "
            "scheduler.rollout_order=fair), fair_adaptive (fair, and only as "
            "many jobs in the loop as saturate the trainer: "
            "scheduler.concurrency=adaptive) and fifo (one job at a time, in "
            "arrival order)."
        },
    )
    repeats: int = field(
        default=3,
        metadata={
            "help": "Times every (service, rate) runs, interleaved; tables show "
            "mean +- sd. Repeat r draws the same arrival times for every service."
        },
    )
    seed: int = field(default=0, metadata={"help": "Seed of the arrival times."})
    lines_per_job: int = field(
        default=4,
        metadata={"help": "Training lines per job (generated arithmetic prompts)."},
    )
    batch_size: int = field(default=2, metadata={"help": "Jobs' batch_size."})
    n_epochs: int = field(
        default=1, metadata={"help": "Jobs' n_epochs (steps = lines / batch x this)."}
    )
    compute_multiplier: float = field(
        default=0.5,
        metadata={"help": "Jobs' compute_multiplier (group size, docs/service.md)."},
    )
    grader: str = field(
        default="string_check",
        metadata={"help": f"Jobs' grader, of {list(GRADERS)}."},
    )
    run_timeout_s: float = field(
        default=3600.0,
        metadata={"help": "A run (all its jobs) is failed after this long."},
    )
    out: str = field(
        default="runs/bench_service",
        metadata={
            "help": "Folder for bench_service.json, .md and the plot (runs/ is "
            "ignored: a result to keep is copied to docs/results/)."
        },
    )
    work_dir: str = field(
        default="",
        metadata={
            "help": "Each service's root (database, files, adapters, logs); "
            "empty = <cluster.fileroot>/<experiment_name>-bench."
        },
    )

    def __post_init__(self):
        if not isinstance(self.jobs, int) or self.jobs < 1:
            raise ConfigError(f"load.jobs must be an integer >= 1, got {self.jobs}.")
        self.tenants = [
            t if isinstance(t, TenantLoad) else TenantLoad(**t) for t in self.tenants
        ]
        names = [t.name for t in self.tenants]
        if len(set(names)) != len(names):
            raise ConfigError(f"load.tenants: names must be unique, got {names}.")
        self.rates_per_min = [float(r) for r in self.rates_per_min]
        if not self.rates_per_min or any(
            not (r > 0 and math.isfinite(r)) for r in self.rates_per_min
        ):
            raise ConfigError(
                "load.rates_per_min must be a non-empty list of rates > 0 (jobs "
                f"per minute), got {self.rates_per_min}."
            )
        self.services = list(self.services)
        unknown = sorted(set(self.services) - set(SERVICES))
        if not self.services or unknown:
            raise ConfigError(
                f"load.services: unknown {unknown or self.services}; choose from "
                f"{list(SERVICES)}."
            )
        if self.repeats < 1:
            raise ConfigError(f"load.repeats must be >= 1, got {self.repeats}.")
        if self.batch_size < 1 or self.lines_per_job < self.batch_size:
            raise ConfigError(
                "load.lines_per_job must be >= load.batch_size >= 1 (a job needs "
                f"one whole batch), got {self.lines_per_job} and {self.batch_size}."
            )
        if self.n_epochs < 1:
            raise ConfigError(f"load.n_epochs must be >= 1, got {self.n_epochs}.")
        if not self.compute_multiplier > 0:
            raise ConfigError("load.compute_multiplier must be > 0.")
        if self.grader not in GRADERS:
            raise ConfigError(
                f"load.grader must be one of {list(GRADERS)}, got {self.grader!r}."
            )
        if not self.run_timeout_s > 0:
            raise ConfigError("load.run_timeout_s must be > 0.")


@dataclass
class ServiceBenchConfig(ServiceRunConfig):
    """A service config plus the load the bench sends to it."""

    load: ServiceLoadConfig = field(
        default_factory=ServiceLoadConfig,
        metadata={"help": "What marlaas bench-service sends."},
    )
