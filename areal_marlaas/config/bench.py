"""``marlaas bench`` settings: the ``bench:`` section beside a training config."""

from __future__ import annotations

from dataclasses import dataclass, field

from areal_marlaas.config.run import MARLaaSConfig
from areal_marlaas.errors import ConfigError
from areal_marlaas.scheduler.core import MODES

# How the trainer runs in a bench run: in the bench's subprocess, or as AReaL
# LocalScheduler workers (marlaas train's default placement).
SCHEDULERS = ("null", "local")
# ablation -> (mode, extra train overrides, trainer placement; {server_cpus} =
# bench.server_cpus). Compare each with its mode run on the same placement.
ABLATIONS: dict[str, tuple[str, dict[str, str], str]] = {
    "no_multi_lora": ("async", {"scheduler.multi_lora": "false"}, "null"),
    "elastic": ("async", {"scheduler.elastic_cpus": "'{server_cpus}'"}, "null"),
    "two_trainers": ("async", {"scheduler.trainers": "2"}, "local"),
    "glibc_heap": ("async", {"keep_freed_pages": "false"}, "null"),
    # Every task evaluates held-out rows after each step (plan.with_evals), with
    # the trainer in the run's process or as LocalScheduler workers (compare
    # with async@local).
    "evals": ("async", {}, "null"),
    "evals_local": ("async", {}, "local"),
}
# The ablations whose tasks evaluate (plan.with_evals).
EVAL_ABLATIONS = ("evals", "evals_local")


@dataclass
class BenchConfig:
    """What ``marlaas bench`` runs (the ``bench:`` section of the config)."""

    task: str = field(
        default="",
        metadata={
            "help": "Task (by name, from the tasks YAML) replicated `replicas` "
            "times as <name>_<i> with seed + i; empty = the task mix as given."
        },
    )
    replicas: int = field(
        default=8,
        metadata={"help": "Tenants in the mode runs; 0 = as many as the tasks."},
    )
    steps: int = field(
        default=3, metadata={"help": "Training steps per task; 0 = the tasks' own."}
    )
    modes: list[str] = field(
        default_factory=lambda: list(MODES),
        metadata={"help": f"Scheduler modes to run, of {list(MODES)}."},
    )
    ablations: list[str] = field(
        default_factory=lambda: ["no_multi_lora"],
        metadata={
            "help": f"Ablation runs, of {list(ABLATIONS)} (no_multi_lora: async "
            "with one adapter per server batch; evals: async where every task "
            "evaluates bench.eval_samples held-out rows after each step; "
            "evals_local: the same with the trainer as LocalScheduler workers, "
            "to compare with async@local; elastic: "
            "async whose trainer "
            "borrows the server's cores while no rollout runs; two_trainers: "
            "async with scheduler.trainers=2 as LocalScheduler workers, to "
            "compare with async@local; glibc_heap: async whose trainer keeps "
            "glibc's malloc defaults, keep_freed_pages=false). Without asynchrony "
            "= mode sync."
        },
    )
    concurrency: list[int] = field(
        default_factory=lambda: [1, 2, 4, 8],
        metadata={"help": "Tenant counts of the sweep (empty = no sweep)."},
    )
    eval_samples: int = field(
        default=8,
        metadata={
            "help": "The evals ablation: held-out rows per eval (the test split "
            "of the task's kind, holdout 0.2; it measures speed, not learning)."
        },
    )
    repeats: int = field(
        default=3,
        metadata={
            "help": "Times every configuration runs; tables show mean +- sd. "
            "Repeats are interleaved (all configurations once, then again) so "
            "drift hits every mode alike."
        },
    )
    # hydra reads `bench.schedulers=[null,local]` with None for null: same as "null".
    schedulers: list[str | None] = field(
        default_factory=lambda: ["null"],
        metadata={
            "help": f"Trainer placements of the mode runs, of {list(SCHEDULERS)}: "
            "null = in the run's process, local = AReaL LocalScheduler workers "
            "(the default path of marlaas train)."
        },
    )
    replicated: list[int] = field(
        default_factory=list,
        metadata={
            "help": "Tenant counts of the replicated AReaL baseline (what a "
            "platform runs today): N single-task runs of AReaL's PPOTrainer "
            "(bench/areal_replica.py, on-policy), each with its own vLLM server, "
            "started together on the whole machine; compare with "
            "bench.concurrency at the same counts. Empty = none."
        },
    )
    replicated_config: str = field(
        default="examples/single_task_ppotrainer.yaml",
        metadata={"help": "AReaL config of each replica (the example's)."},
    )
    replicated_kv_gib: int = field(
        default=1,
        metadata={
            "help": "KV cache of each replica's vLLM server, whole GiB (vLLM's "
            "CPU backend takes no fraction): the least it takes, one tenant's "
            "batch needs ~0.1; the plugin's server default is 4."
        },
    )
    memory_limit_gib: float = field(
        default=0.0,
        metadata={
            "help": "A replicated run whose memory, projected from the previous "
            "(smaller) one per replica, would pass this is not started and "
            "recorded as not fitting; 0 = the machine's total memory."
        },
    )
    sweep_mode: str = field(
        default="async", metadata={"help": "Scheduler mode of the sweep runs."}
    )
    out: str = field(
        default="runs/bench",
        metadata={
            "help": "Where bench.json, bench.md, PNGs, the simulator's "
            "fit_input.json and the raw run logs (runs/, never committed) go; "
            "a result to keep is copied to docs/results/ without runs/."
        },
    )
    work_dir: str = field(
        default="",
        metadata={
            "help": "Run directories and server logs; empty = "
            "<cluster.fileroot>/<experiment_name>-bench."
        },
    )
    server_cpus: str = field(
        default="0",
        metadata={"help": "Disaggregated: cores of the vLLM server (affinity, OMP)."},
    )
    trainer_cpus: str = field(
        default="1", metadata={"help": "Disaggregated: cores of the trainer."}
    )
    collocated_cpus: str = field(
        default="0-1",
        metadata={"help": "Collocated: cores the server and the trainer share."},
    )
    warmup_requests: int = field(
        default=8, metadata={"help": "Completions sent to each new server first."}
    )
    warmup_run: bool = field(
        default=True,
        metadata={"help": "A discarded 1-task 1-step training run before the first."},
    )
    sample_interval_s: float = field(
        default=0.5, metadata={"help": "Utilization sampling period."}
    )
    run_timeout_s: float = field(
        default=3600.0, metadata={"help": "A run still going after this fails."}
    )
    keep_adapters: bool = field(
        default=False,
        metadata={"help": "Keep each run's adapter folders in the work dir."},
    )

    def __post_init__(self):
        for m in self.modes:
            if m not in MODES:
                raise ConfigError(
                    f"bench.modes: unknown mode {m!r}; use some of {list(MODES)}."
                )
        for a in self.ablations:
            if a not in ABLATIONS:
                raise ConfigError(
                    f"bench.ablations: unknown ablation {a!r}; use some of "
                    f"{list(ABLATIONS)} (without asynchrony is mode sync)."
                )
        if not isinstance(self.eval_samples, int) or self.eval_samples < 1:
            raise ConfigError(
                "bench.eval_samples must be an integer >= 1, got "
                f"{self.eval_samples!r}."
            )
        if self.repeats < 1:
            raise ConfigError(f"bench.repeats must be >= 1, got {self.repeats}.")
        self.schedulers = ["null" if s is None else s for s in self.schedulers]
        for sched in self.schedulers:
            if sched not in SCHEDULERS:
                raise ConfigError(
                    f"bench.schedulers: unknown {sched!r}; use some of "
                    f"{list(SCHEDULERS)}."
                )
        if not self.schedulers:
            raise ConfigError("bench.schedulers: give at least one (null).")
        if self.replicas < 0:
            raise ConfigError(f"bench.replicas must be >= 0, got {self.replicas}.")
        if self.task and self.replicas < 1:
            raise ConfigError("bench.replicas must be >= 1 when bench.task is set.")
        if self.steps < 0:
            raise ConfigError(f"bench.steps must be >= 0, got {self.steps}.")
        if any(int(c) < 1 for c in self.concurrency):
            raise ConfigError(
                f"bench.concurrency: tenant counts must be >= 1, got "
                f"{list(self.concurrency)}."
            )
        if self.concurrency and self.sweep_mode not in MODES:
            raise ConfigError(
                f"bench.sweep_mode: unknown mode {self.sweep_mode!r}; use one of "
                f"{list(MODES)}."
            )
        if not (self.modes or self.ablations or self.concurrency or self.replicated):
            raise ConfigError(
                "bench: nothing to run; give bench.modes, bench.ablations, "
                "bench.concurrency or bench.replicated."
            )
        if any(int(c) < 1 for c in self.replicated):
            raise ConfigError(
                f"bench.replicated: tenant counts must be >= 1, got "
                f"{list(self.replicated)}."
            )
        if not isinstance(self.replicated_kv_gib, int) or self.replicated_kv_gib < 1:
            raise ConfigError(
                "bench.replicated_kv_gib must be a whole number of GiB >= 1 (vLLM's "
                f"CPU KV cache size), got {self.replicated_kv_gib}."
            )
        if self.memory_limit_gib < 0:
            raise ConfigError(
                "bench.memory_limit_gib must be >= 0 (0 = the machine's memory)."
            )
        if self.sample_interval_s <= 0:
            raise ConfigError("bench.sample_interval_s must be > 0.")
        if self.run_timeout_s <= 0:
            raise ConfigError("bench.run_timeout_s must be > 0.")


@dataclass
class BenchRunConfig(MARLaaSConfig):
    """A training config plus the bench's own section."""

    bench: BenchConfig = field(
        default_factory=BenchConfig, metadata={"help": "What marlaas bench runs."}
    )
