"""``marlaas service`` settings: where it keeps its state, what it serves, the
limits and defaults it applies to tenants' jobs (``service.*``), and how jobs are
graded (``grading.*``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from areal_marlaas.config.run import MARLaaSConfig
from areal_marlaas.errors import ConfigError
from areal_marlaas.graders.context import GradingContext
from areal_marlaas.paths import DEFAULT_MODEL_NAME, cache_dir

# Built-in task kinds a `{"type": "marlaas", "kind": ...}` grader may name
# (areal_marlaas.tasks.KINDS; not imported: it pulls the dataset loaders).
DEFAULT_GRADER_KINDS = ["addition", "multiplication", "gsm8k", "amc", "math"]


@dataclass
class EgressConfig:
    """Where tenants' tools and endpoint graders may connect (agents/egress.py):
    public addresses, plus what is listed here."""

    allow: list[str] = field(
        default_factory=list,
        metadata={
            "help": "Networks (CIDR) or hostnames every tenant may reach although "
            "not public, e.g. 10.1.0.0/16 or tools.internal; 127.0.0.0/8 allows "
            "this machine (tests). Refused by default: private, loopback, "
            "link-local (169.254.169.254), CGNAT, reserved."
        },
    )
    only_allowed: bool = field(
        default=False,
        metadata={"help": "True: nothing but the listed networks and hosts."},
    )
    tenants: dict[str, list[str]] = field(
        default_factory=dict,
        metadata={
            "help": "Tenant name -> networks or hosts that tenant may reach too."
        },
    )

    def __post_init__(self):
        from areal_marlaas.agents.egress import EgressPolicy

        self.allow = list(self.allow or [])
        self.tenants = {str(k): list(v or []) for k, v in (self.tenants or {}).items()}
        for entry in self.allow + [e for v in self.tenants.values() for e in v]:
            if not isinstance(entry, str) or not entry:
                raise ConfigError(
                    "service.egress.allow and service.egress.tenants.* list "
                    f"networks (CIDR) or hostnames, got {entry!r}."
                )
        EgressPolicy(tuple(self.allow), self.only_allowed)  # parses

    def policy(self, tenant_name: str):
        from areal_marlaas.agents.egress import EgressPolicy

        extra = self.tenants.get(tenant_name, [])
        return EgressPolicy(tuple(self.allow + extra), self.only_allowed)


@dataclass
class ServiceConfig:
    """The HTTP API and job store of ``marlaas service``."""

    host: str = field(default="127.0.0.1", metadata={"help": "Address the API binds."})
    port: int = field(
        default=8000, metadata={"help": "API port; 0 = any free port (tests)."}
    )
    root: str = field(
        default="",
        metadata={
            "help": "Service folder: the SQLite DB, uploaded file bodies "
            "(files/<tenant>/), adapters, the admin key hash. Empty = "
            "$MARLAAS_CACHE/service."
        },
    )
    db_url: str = field(
        default="",
        metadata={
            "help": "SQLAlchemy URL of the job store, e.g. "
            "postgresql+psycopg://user:pw@host/db. Empty = sqlite:///<root>/service.db."
        },
    )
    base_model: str = field(
        default=DEFAULT_MODEL_NAME,
        metadata={
            "help": "Public name of the served base model: the only `model` a job "
            "may fine-tune, and a chat model every tenant may use."
        },
    )
    base_learning_rate: float = field(
        default=1e-4,
        metadata={"help": "AdamW lr that learning_rate_multiplier scales."},
    )
    supervised_learning_rate: float = field(
        default=1e-3,
        metadata={
            "help": "A supervised job's AdamW lr that its learning_rate_multiplier "
            "scales (a LoRA on demonstrations takes larger steps than GRPO's)."
        },
    )
    max_running_jobs: int = field(
        default=2,
        metadata={
            "help": "Per tenant: jobs the scheduler runs at once; more wait in "
            "`queued` (a full pool never fails a job)."
        },
    )
    max_queued_jobs: int = field(
        default=8,
        metadata={
            "help": "Per tenant: jobs waiting (validating_files, queued, paused); "
            "a create beyond it gets 429."
        },
    )
    max_file_bytes: int = field(
        default=64 * 1024 * 1024,
        metadata={"help": "Largest upload; a bigger one gets 413."},
    )
    max_files: int = field(
        default=100,
        metadata={"help": "Per tenant: stored (not deleted) files; more gets 429."},
    )
    max_request_bytes: int = field(
        default=4 * 1024 * 1024,
        metadata={"help": "Largest JSON body (jobs, chat); a bigger one gets 413."},
    )
    default_batch_size: int = field(
        default=8, metadata={"help": "batch_size 'auto': prompts per GRPO step."}
    )
    default_n_epochs: int = field(
        default=1, metadata={"help": "n_epochs 'auto': passes over the train file."}
    )
    default_compute_multiplier: float = field(
        default=1.0,
        metadata={"help": "compute_multiplier 'auto' (group size multiplier)."},
    )
    group_size_per_multiplier: int = field(
        default=4,
        metadata={
            "help": "GRPO group size at compute_multiplier 1: completions per "
            "prompt = max(2, round(this x compute_multiplier))."
        },
    )
    max_group_size: int = field(
        default=64,
        metadata={"help": "Largest GRPO group a compute_multiplier may ask for."},
    )
    default_eval_interval: int = field(
        default=10,
        metadata={"help": "eval_interval 'auto': steps between validation runs."},
    )
    default_eval_samples: int = field(
        default=32,
        metadata={"help": "eval_samples 'auto': validation rows per evaluation."},
    )
    default_learning_rate_multiplier: float = field(
        default=1.0, metadata={"help": "learning_rate_multiplier 'auto'."}
    )
    max_steps_per_job: int = field(
        default=200,
        metadata={"help": "Cap on a job's training steps (epochs x rows / batch)."},
    )
    grader_kinds: list[str] = field(
        default_factory=lambda: list(DEFAULT_GRADER_KINDS),
        metadata={
            "help": "Task kinds a {type: marlaas, kind: K} grader may name "
            "(the default grader validator)."
        },
    )
    inference_adapters: int = field(
        default=4,
        metadata={
            "help": "Checkpoint adapters kept loaded on the vLLM server for chat "
            "(LRU); keep it below vllm.max_cpu_loras minus the training adapters."
        },
    )
    keep_checkpoints: int = field(
        default=3,
        metadata={
            "help": "Per job: the best N checkpoints by valid_reward_mean "
            "(train_reward_mean without a validation file) are kept, and the "
            "newest; the others' adapters are deleted and their names answer "
            "404. 0 = keep every checkpoint."
        },
    )
    admin_key_file: str = field(
        default="",
        metadata={
            "help": "File holding the sha256 of the operator's admin key "
            "(`marlaas service admin-key`). Empty = <root>/admin_key.sha256."
        },
    )
    metrics_public: bool = field(
        default=False,
        metadata={"help": "Serve /metrics without the admin key."},
    )
    max_new_tokens: int = field(
        default=128,
        metadata={"help": "Generation cap of a job's rollouts (tokens per sample)."},
    )
    max_prompt_tokens: int = field(
        default=512,
        metadata={
            "help": "Longest prompt of a training line, in tokens; longer lines "
            "are skipped (and counted in the job's events)."
        },
    )

    temperature: float = field(
        default=1.0, metadata={"help": "Sampling temperature of jobs' rollouts."}
    )
    poll_interval_s: float = field(
        default=0.5,
        metadata={
            "help": "How often the scheduler side reads new jobs and cancel / "
            "pause / resume requests from the store."
        },
    )
    max_tasks: int = field(
        default=64,
        metadata={"help": "Jobs the scheduler holds at once (running or waiting)."},
    )
    webhook_timeout_s: float = field(
        default=10.0,
        metadata={
            "help": "Per webhook POST: seconds to connect, and between bytes of "
            "the reply; a slower receiver counts as a failed attempt."
        },
    )
    webhook_backoff_s: float = field(
        default=5.0,
        metadata={
            "help": "Delay before a failed webhook delivery's 2nd attempt; each "
            "later one waits twice as long (5 s: 5, 10, ..., 320 s)."
        },
    )
    webhook_max_attempts: int = field(
        default=8,
        metadata={
            "help": "Attempts per webhook delivery before it is marked failed "
            "(8 with the default backoff: about 10 minutes)."
        },
    )
    webhook_workers: int = field(
        default=4,
        metadata={
            "help": "Threads posting webhooks: this many hanging receivers at "
            "once delay the others' deliveries (never a job)."
        },
    )

    egress: EgressConfig = field(
        default_factory=EgressConfig,
        metadata={"help": "Where tenants' tools and endpoint graders may connect."},
    )
    tool_timeout_s: float = field(
        default=600.0,
        metadata={
            "help": "One tool call's limit (OpenAI: 10 min); past it the model "
            "reads a timeout error."
        },
    )
    max_episode_steps: int = field(
        default=10,
        metadata={"help": "Default and upper bound of a job's max_episode_steps."},
    )
    agent_episode_tokens: int = field(
        default=384,
        metadata={
            "help": "An agent job's response budget per episode: generated and "
            "tool-message tokens together (each turn generates at most "
            "max_new_tokens); its rollouts' KV footprint counts it."
        },
    )
    agent_max_prompt_tokens: int = field(
        default=640,
        metadata={
            "help": "An agent job's longest prompt (messages with the tools "
            "section); longer lines are skipped. With agent_episode_tokens it "
            "must fit the server's max_model_len."
        },
    )

    def __post_init__(self):
        if isinstance(self.egress, dict):
            self.egress = EgressConfig(**self.egress)
        if not (self.tool_timeout_s > 0 and math.isfinite(self.tool_timeout_s)):
            raise ConfigError("service.tool_timeout_s must be > 0 seconds.")
        if not isinstance(self.host, str) or not self.host:
            raise ConfigError("service.host must be a non-empty address.")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"service.port must be in [0, 65535], got {self.port}.")
        if not self.base_model or "\n" in self.base_model:
            raise ConfigError("service.base_model must be a non-empty name.")
        for key in ("base_learning_rate", "supervised_learning_rate"):
            value = getattr(self, key)
            if not (value > 0 and math.isfinite(value)):
                raise ConfigError(f"service.{key} must be > 0, got {value}.")
        if not self.temperature > 0 or self.temperature > 2:
            raise ConfigError(
                f"service.temperature must be in (0, 2], got {self.temperature}."
            )
        if not self.poll_interval_s > 0:
            raise ConfigError("service.poll_interval_s must be > 0.")
        for key in ("webhook_timeout_s", "webhook_backoff_s"):
            value = getattr(self, key)
            if not (value > 0 and math.isfinite(value)):
                raise ConfigError(f"service.{key} must be > 0 seconds, got {value}.")
        at_least_one = {
            "max_new_tokens": self.max_new_tokens,
            "max_prompt_tokens": self.max_prompt_tokens,
            "max_tasks": self.max_tasks,
            "max_running_jobs": self.max_running_jobs,
            "max_queued_jobs": self.max_queued_jobs,
            "max_file_bytes": self.max_file_bytes,
            "max_files": self.max_files,
            "max_request_bytes": self.max_request_bytes,
            "default_batch_size": self.default_batch_size,
            "default_n_epochs": self.default_n_epochs,
            "default_eval_interval": self.default_eval_interval,
            "default_eval_samples": self.default_eval_samples,
            "max_steps_per_job": self.max_steps_per_job,
            "inference_adapters": self.inference_adapters,
            "webhook_max_attempts": self.webhook_max_attempts,
            "webhook_workers": self.webhook_workers,
            "max_episode_steps": self.max_episode_steps,
            "agent_episode_tokens": self.agent_episode_tokens,
            "agent_max_prompt_tokens": self.agent_max_prompt_tokens,
        }
        for key, value in at_least_one.items():
            if not isinstance(value, int) or value < 1:
                raise ConfigError(
                    f"service.{key} must be an integer >= 1, got {value}."
                )
        if not isinstance(self.keep_checkpoints, int) or self.keep_checkpoints < 0:
            raise ConfigError(
                "service.keep_checkpoints must be an integer >= 0 (0 = keep all), "
                f"got {self.keep_checkpoints}."
            )
        if self.group_size_per_multiplier < 2:
            raise ConfigError(
                "service.group_size_per_multiplier must be >= 2 (GRPO normalizes "
                f"within a group), got {self.group_size_per_multiplier}."
            )
        if self.max_group_size < self.group_size_per_multiplier:
            raise ConfigError(
                "service.max_group_size must be >= group_size_per_multiplier, got "
                f"{self.max_group_size}."
            )
        for key in ("default_compute_multiplier", "default_learning_rate_multiplier"):
            value = getattr(self, key)
            if not (value > 0 and math.isfinite(value)):
                raise ConfigError(f"service.{key} must be > 0, got {value}.")
        if self.grader_kinds is None or any(
            not isinstance(k, str) or not k for k in self.grader_kinds
        ):
            raise ConfigError("service.grader_kinds must be a list of kind names.")
        self.grader_kinds = list(self.grader_kinds)

    # -- derived paths ------------------------------------------------------------
    @property
    def root_dir(self) -> Path:
        return Path(self.root).expanduser() if self.root else cache_dir() / "service"

    @property
    def database_url(self) -> str:
        return self.db_url or f"sqlite:///{self.root_dir / 'service.db'}"

    @property
    def admin_key_path(self) -> Path:
        if self.admin_key_file:
            return Path(self.admin_key_file).expanduser()
        return self.root_dir / "admin_key.sha256"

    @property
    def supervised_max_tokens(self) -> int:
        """The longest example (a sequence of it) a supervised or DPO job trains on."""
        return self.max_prompt_tokens + self.max_new_tokens


@dataclass
class ServiceRunConfig(MARLaaSConfig):
    """A MARLaaS run whose tasks are tenants' jobs: no tasks in the YAML; they
    arrive through the HTTP API."""

    needs_tasks = False

    experiment_name: str = field(
        default="marlaas-service",
        metadata={"help": "The service's run directory name (jobs' adapters)."},
    )
    trial_name: str = field(default="service", metadata={"help": "Its trial name."})
    service: ServiceConfig = field(
        default_factory=ServiceConfig,
        metadata={"help": "The HTTP API, the job store and tenants' limits."},
    )
    grading: GradingContext = field(
        default_factory=GradingContext,
        metadata={
            "help": "Graders' environment: judge and embedding endpoints, the "
            "python sandbox's limits."
        },
    )

    def __post_init__(self):
        super().__post_init__()
        if self.fault.keep_adapters:
            # Deleting adapter folders behind the job store's back would leave
            # checkpoints whose files are gone.
            raise ConfigError(
                "fault.keep_adapters is not used by marlaas service: a job's "
                "adapters are its checkpoints, kept by service.keep_checkpoints. "
                "Remove fault.keep_adapters from the config."
            )
