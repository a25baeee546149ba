"""MARLaaS configuration: AReaL's GRPOConfig plus tenant tasks and the rollout server.

Tasks come from the main YAML (``tasks:``), from a tasks YAML named by ``tasks_file``
in it or on the command line (``tasks_file=...`` or ``--tasks FILE``). Every field,
task fields included, takes hydra-style overrides (``tasks.0.batch_size=8``).
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field
from pathlib import Path

from areal.api.cli_args import (
    ClusterSpecConfig,
    EvaluatorConfig,
    GRPOConfig,
    InferenceEngineConfig,
    OptimizerConfig,
    PPOActorConfig,
    RecoverConfig,
    SaverConfig,
    SchedulerConfig,
    StatsLoggerConfig,
    TrainDatasetConfig,
    to_structured_cfg,
)
from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from areal_marlaas.adapters import VLLM_LORA_RANKS
from areal_marlaas.errors import ConfigError
from areal_marlaas.fault import FaultToleranceConfig
from areal_marlaas.paths import default_model_path
from areal_marlaas.placement import parse_cpus
from areal_marlaas.rollout.server import MultiLoRAvLLMConfig, RolloutServerConfig
from areal_marlaas.scheduler.core import MODES
from areal_marlaas.tasks import KINDS
from areal_marlaas.tasks.search import SCORER_REWARD_FNS

# Task names become adapter names and folder names: keep them path- and URL-safe.
TASK_NAME = re.compile(r"^[a-z0-9][a-z0-9_]{0,47}$")


@dataclass
class TaskDatasetConfig:
    """Where a task's prompts come from."""

    path: str = field(
        default="",
        metadata={
            "help": "jsonl/json file, folder with <split>.jsonl, or hub id. Empty for "
            "synthetic kinds (addition, multiplication)."
        },
    )
    split: str = field(default="train", metadata={"help": "Dataset split."})
    size: int = field(
        default=0,
        metadata={
            "help": "Rows to use: synthetic kinds generate this many (0 = 1024); "
            "file datasets are cut to it (0 = all)."
        },
    )
    digits: int = field(
        default=2, metadata={"help": "Synthetic arithmetic: digits per operand."}
    )


SEARCH_SCORERS = ("em", "f1", "judge")


@dataclass
class SearchConfig:
    """The search agent's environment (kind wiki_search): a local BM25 corpus,
    the tool budget and how final answers are scored."""

    corpus_path: str = field(
        default="",
        metadata={"help": "jsonl corpus of {id, title, text} passages to search."},
    )
    top_k: int = field(default=3, metadata={"help": "Passages returned per search."})
    max_tool_calls: int = field(
        default=5, metadata={"help": "Searches allowed per episode; more scores 0."}
    )
    tool_timeout_s: float = field(
        default=10.0,
        metadata={
            "help": "Per-search time limit; a timed-out search returns an "
            "error message to the model."
        },
    )
    passage_chars: int = field(
        default=300, metadata={"help": "Characters kept per returned passage."}
    )
    response_prefix: str = field(
        default="<search>",
        metadata={
            "help": "Text the agent's reply starts with (prompt tokens, not "
            "trained on). '<search>' makes small models that ignore the tag "
            "format start with a search; '' leaves the first move to the model."
        },
    )
    scorer: str = field(
        default="em",
        metadata={"help": f"Final-answer scorer: one of {list(SEARCH_SCORERS)}."},
    )
    judge_url: str = field(
        default="",
        metadata={
            "help": "scorer=judge: OpenAI-compatible endpoint, e.g. "
            "http://host:port/v1/chat/completions (or /v1/completions)."
        },
    )
    judge_model: str = field(
        default="", metadata={"help": "scorer=judge: the served model id."}
    )
    judge_timeout_s: float = field(
        default=30.0, metadata={"help": "scorer=judge: per-request timeout."}
    )
    judge_retries: int = field(
        default=2, metadata={"help": "scorer=judge: retries after a failed request."}
    )

    def check(self, where: str) -> None:
        """Raise ``ConfigError`` naming the first bad ``search.*`` field."""
        if self.top_k < 1:
            raise ConfigError(f"{where}: search.top_k must be >= 1, got {self.top_k}.")
        if self.max_tool_calls < 0:
            raise ConfigError(f"{where}: search.max_tool_calls must be >= 0.")
        if not self.tool_timeout_s > 0:
            raise ConfigError(f"{where}: search.tool_timeout_s must be > 0.")
        if self.passage_chars < 1:
            raise ConfigError(f"{where}: search.passage_chars must be >= 1.")
        if self.scorer not in SEARCH_SCORERS:
            raise ConfigError(
                f"{where}: search.scorer must be one of {list(SEARCH_SCORERS)}, "
                f"got {self.scorer!r}."
            )
        if self.scorer == "judge":
            if not self.judge_url.startswith(("http://", "https://")):
                raise ConfigError(
                    f"{where}: search.scorer=judge needs search.judge_url "
                    "(http://host:port/v1/chat/completions), got "
                    f"{self.judge_url!r}."
                )
            if not self.judge_model:
                raise ConfigError(
                    f"{where}: search.scorer=judge needs search.judge_model."
                )
        if not self.judge_timeout_s > 0:
            raise ConfigError(f"{where}: search.judge_timeout_s must be > 0.")
        if self.judge_retries < 0:
            raise ConfigError(f"{where}: search.judge_retries must be >= 0.")


@dataclass
class TaskSpec:
    """One tenant task: its own LoRA adapter, data, reward and GRPO settings."""

    name: str = field(
        default=MISSING,
        metadata={"help": "Unique id: lowercase letters, digits, '_' (max 48)."},
    )
    kind: str = field(
        default="",
        metadata={"help": f"Built-in task kind: one of {sorted(KINDS)}."},
    )
    workflow: str = field(
        default="",
        metadata={
            "help": "Import path of a RolloutWorkflow to use instead of the kind's "
            "default (needs reward_fn and dataset.path when kind is empty)."
        },
    )
    dataset: TaskDatasetConfig = field(default_factory=TaskDatasetConfig)
    search: SearchConfig = field(
        default_factory=SearchConfig,
        metadata={"help": "Search-agent settings (kind wiki_search)."},
    )
    reward_fn: str = field(
        default="",
        metadata={
            "help": "Import path of fn(prompt, completions, ..., **row); "
            "empty = the kind's default."
        },
    )
    batch_size: int = field(default=8, metadata={"help": "Prompts per step."})
    n_samples: int = field(
        default=4, metadata={"help": "Completions per prompt (the GRPO group)."}
    )
    max_new_tokens: int = field(default=64, metadata={"help": "Generation cap."})
    max_prompt_tokens: int = field(
        default=256,
        metadata={
            "help": "Longest prompt kept (longer rows are dropped); also the "
            "prompt length in KV-cache estimates."
        },
    )
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature."})
    total_steps: int = field(default=10, metadata={"help": "Training steps to run."})
    lr: float = field(default=1e-4, metadata={"help": "AdamW learning rate."})
    seed: int = field(default=1, metadata={"help": "Data order and sampling seed."})
    reward_timeout_s: float = field(
        default=0.0,
        metadata={"help": "Per-call reward timeout; 0 = fault.reward_timeout_s."},
    )
    priority: int = field(
        default=0, metadata={"help": "Admission priority (higher goes first)."}
    )
    lora_rank: int | None = field(
        default=None,
        metadata={
            "help": "Must equal actor.lora_rank (one shared LoRA slot); None = inherit."
        },
    )
    lora_alpha: int | None = field(
        default=None, metadata={"help": "Must equal actor.lora_alpha; None = inherit."}
    )
    target_modules: list[str] | None = field(
        default=None,
        metadata={"help": "Must equal actor.target_modules; None = inherit."},
    )

    def __post_init__(self):
        where = f"task {self.name!r}"
        if not isinstance(self.name, str) or not TASK_NAME.match(self.name):
            raise ConfigError(
                f"{where}: name must match {TASK_NAME.pattern} (lowercase letters, "
                "digits, '_'; it becomes a folder and an adapter name)."
            )
        if not self.kind and not self.workflow:
            raise ConfigError(
                f"{where}: set kind (one of {sorted(KINDS)}) or workflow (import path)."
            )
        if self.kind and self.kind not in KINDS:
            raise ConfigError(
                f"{where}: unknown kind {self.kind!r}; choose one of {sorted(KINDS)} "
                "or set workflow to an import path."
            )
        if not self.kind:
            if not self.reward_fn:
                raise ConfigError(f"{where}: reward_fn is required when kind is empty.")
            if not self.dataset.path:
                raise ConfigError(
                    f"{where}: dataset.path is required when kind is empty."
                )
        elif KINDS[self.kind].needs_path and not self.dataset.path:
            raise ConfigError(
                f"{where}: kind {self.kind!r} needs dataset.path (a file, a folder "
                "with <split>.jsonl, or a hub id)."
            )
        if self.kind and KINDS[self.kind].needs_search and not self.search.corpus_path:
            raise ConfigError(
                f"{where}: kind {self.kind!r} needs search.corpus_path (a jsonl of "
                "{id, title, text} passages)."
            )
        self.search.check(where)
        positive = {
            "batch_size": self.batch_size,
            "max_new_tokens": self.max_new_tokens,
            "max_prompt_tokens": self.max_prompt_tokens,
            "total_steps": self.total_steps,
        }
        for key, value in positive.items():
            if value < 1:
                raise ConfigError(f"{where}: {key} must be >= 1, got {value}.")
        if self.n_samples < 2:
            raise ConfigError(
                f"{where}: n_samples must be >= 2 (GRPO normalizes rewards within "
                f"each prompt's group), got {self.n_samples}."
            )
        if not 0 < self.temperature <= 2:
            raise ConfigError(
                f"{where}: temperature must be in (0, 2], got {self.temperature}."
            )
        if not self.lr > 0:
            raise ConfigError(f"{where}: lr must be > 0, got {self.lr}.")
        if self.reward_timeout_s < 0:
            raise ConfigError(f"{where}: reward_timeout_s must be >= 0.")
        if self.dataset.size < 0:
            raise ConfigError(f"{where}: dataset.size must be >= 0.")
        if not 1 <= self.dataset.digits <= 9:
            raise ConfigError(f"{where}: dataset.digits must be in [1, 9].")

    @property
    def reward_fn_path(self) -> str:
        if self.reward_fn:
            return self.reward_fn
        if KINDS[self.kind].needs_search and self.search.scorer in SCORER_REWARD_FNS:
            return SCORER_REWARD_FNS[self.search.scorer]
        return KINDS[self.kind].reward_fn


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

    def __post_init__(self):
        parent = getattr(super(), "__post_init__", None)
        if parent is not None:
            parent()
        if self.mode not in MODES:
            raise ConfigError(
                f"scheduler.mode must be one of {list(MODES)}, got {self.mode!r}."
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
        parse_cpus(self.trainer_cpus, "scheduler.trainer_cpus")

    @property
    def max_rolling(self) -> int | None:
        """Tasks that may roll out at once (None = no cap)."""
        caps = [self.max_concurrent_rollouts] if self.max_concurrent_rollouts else []
        if not self.multi_lora:
            caps.append(1)
        return min(caps) if caps else None


# Nested AReaL configs take the run names from the top level unless a YAML says
# otherwise.
_RUN = {"experiment_name": "${experiment_name}", "trial_name": "${trial_name}"}
_RUN_ROOT = {**_RUN, "fileroot": "${cluster.fileroot}"}
_ACTOR_DEFAULTS = dict(
    **_RUN,
    path="",
    backend="fsdp:d1",
    attn_impl="sdpa",
    dtype="float32",
    use_lora=True,
    lora_rank=8,
    lora_alpha=16,
    target_modules=["all-linear"],
    weight_update_mode="disk",
    ppo_n_minibatches=1,
    use_decoupled_loss=False,
    # Per-task lr comes from tasks[i].lr; the rest of AdamW's settings from here.
    optimizer=OptimizerConfig(lr=1e-4, weight_decay=0.0, gradient_clipping=1.0),
)


@dataclass
class MARLaaSConfig(GRPOConfig):
    """GRPOConfig for many tenant tasks sharing one base model (one LoRA per task).

    Compared with GRPOConfig, the run-name plumbing of the nested configs
    (saver, stats_logger, actor, ...) defaults to the top-level names, so a YAML
    only needs ``experiment_name``, ``trial_name`` and the tasks.
    """

    tasks: list[TaskSpec] = field(
        default_factory=list, metadata={"help": "The tenant tasks."}
    )
    tasks_file: str = field(
        default="",
        metadata={
            "help": "YAML with a top-level `tasks:` list (or a bare list); relative "
            "paths resolve against the working directory, then the main YAML."
        },
    )
    server: RolloutServerConfig = field(
        default_factory=RolloutServerConfig,
        metadata={"help": "The shared multi-LoRA vLLM server (launch or attach)."},
    )
    vllm: MultiLoRAvLLMConfig = field(default_factory=MultiLoRAvLLMConfig)
    fault: FaultToleranceConfig = field(
        default_factory=FaultToleranceConfig,
        metadata={"help": "Server supervision, tenant guards, adapter retention."},
    )
    resume: bool = field(
        default=False,
        metadata={
            "help": "Continue every task of the run directory from its last "
            "committed version (also `marlaas train --resume`)."
        },
    )
    cluster: ClusterSpecConfig = field(
        default_factory=lambda: ClusterSpecConfig(fileroot="/tmp/areal-marlaas")
    )
    actor: PPOActorConfig = field(
        default_factory=lambda: PPOActorConfig(**_ACTOR_DEFAULTS)
    )
    rollout: InferenceEngineConfig = field(
        default_factory=lambda: InferenceEngineConfig(
            **_RUN,
            backend="vllm:d1",
            use_lora=True,
            max_head_offpolicyness=0,
            max_concurrent_rollouts=256,
        )
    )
    train_dataset: TrainDatasetConfig = field(
        default_factory=lambda: TrainDatasetConfig(path="", type="rl"),
        metadata={"help": "Unused: each task names its own dataset."},
    )
    saver: SaverConfig = field(default_factory=lambda: SaverConfig(**_RUN_ROOT))
    evaluator: EvaluatorConfig = field(
        default_factory=lambda: EvaluatorConfig(**_RUN_ROOT)
    )
    stats_logger: StatsLoggerConfig = field(
        default_factory=lambda: StatsLoggerConfig(**_RUN_ROOT)
    )
    recover: RecoverConfig = field(default_factory=lambda: RecoverConfig(**_RUN_ROOT))
    scheduler: MARLaaSSchedulerConfig = field(
        default_factory=lambda: MARLaaSSchedulerConfig(type="local")
    )

    def __post_init__(self):
        super().__post_init__()
        if not self.actor.path:
            self.actor.path = str(default_model_path())
        if not self.tokenizer_path:
            self.tokenizer_path = self.actor.path
        if not self.vllm.model:
            self.vllm.model = self.actor.path
        if not self.tasks:
            raise ConfigError(
                "no tasks: give a tasks YAML (--tasks FILE or tasks_file=FILE) or an "
                "inline `tasks:` list."
            )
        seen: set[str] = set()
        for i, task in enumerate(self.tasks):
            if task.name in seen:
                raise ConfigError(
                    f"tasks.{i}: duplicate task name {task.name!r}; "
                    "names must be unique."
                )
            seen.add(task.name)
        self._check_lora_slot()
        self._check_lengths()
        if self.fault.deterministic:
            # The server's logprobs depend on what it batched (~1e-5); the
            # trainer's own are a function of the tokens alone.
            self.actor.recompute_logprob = True

    def _check_lora_slot(self) -> None:
        actor = self.actor
        if not actor.use_lora:
            raise ConfigError(
                "actor.use_lora must be true: every task is a LoRA adapter."
            )
        if actor.lora_rank not in VLLM_LORA_RANKS:
            raise ConfigError(
                f"actor.lora_rank={actor.lora_rank} is not a rank vLLM serves; use one "
                f"of {list(VLLM_LORA_RANKS)}."
            )
        if actor.lora_rank > self.vllm.max_lora_rank:
            raise ConfigError(
                f"actor.lora_rank={actor.lora_rank} exceeds vllm.max_lora_rank="
                f"{self.vllm.max_lora_rank}; raise vllm.max_lora_rank."
            )
        shared = {
            "lora_rank": actor.lora_rank,
            "lora_alpha": actor.lora_alpha,
            "target_modules": list(actor.target_modules),
        }
        for i, task in enumerate(self.tasks):
            for key, want in shared.items():
                got = getattr(task, key)
                if (
                    got is not None
                    and (list(got) if key == "target_modules" else got) != want
                ):
                    raise ConfigError(
                        f"tasks.{i} ({task.name!r}): {key}={got} differs from "
                        "the shared "
                        f"LoRA slot (actor.{key}={want}); all tasks share one slot, so "
                        f"drop tasks.{i}.{key} or change actor.{key}."
                    )

    def _check_lengths(self) -> None:
        limit = self.vllm.max_model_len
        for i, task in enumerate(self.tasks):
            need = task.max_prompt_tokens + task.max_new_tokens
            if limit is not None and need > limit:
                raise ConfigError(
                    f"tasks.{i} ({task.name!r}): max_prompt_tokens + max_new_tokens = "
                    f"{need} exceeds vllm.max_model_len={limit}; lower them or raise "
                    "vllm.max_model_len."
                )


def _resolve_tasks_path(tasks_file: str, config_file: Path) -> Path:
    p = Path(tasks_file).expanduser()
    if p.is_absolute() or p.exists():
        return p
    beside = config_file.parent / p
    return beside if beside.exists() else p


def _load_tasks(path: Path) -> ListConfig:
    if not path.is_file():
        raise ConfigError(f"tasks_file: {path} does not exist.")
    try:
        loaded = OmegaConf.load(path)
    except Exception as e:  # yaml errors come in many types
        raise ConfigError(f"tasks_file: {path} is not valid YAML: {e}") from e
    tasks = loaded.get("tasks") if isinstance(loaded, DictConfig) else loaded
    if not isinstance(tasks, ListConfig):
        raise ConfigError(
            f"tasks_file: {path} must hold a `tasks:` list (or be a list of tasks)."
        )
    _check_task_fields(tasks, str(path))
    return tasks


def _check_task_fields(tasks: ListConfig, where: str) -> None:
    """Unknown keys and wrong types, reported with the task and the field (the
    whole-config conversion only names the field)."""
    schema = OmegaConf.structured(TaskSpec)
    for i, task in enumerate(tasks):
        name = task.get("name", "?") if isinstance(task, DictConfig) else "?"
        if not isinstance(task, DictConfig):
            raise ConfigError(f"{where}: tasks.{i} must be a mapping, got {task!r}.")
        try:
            OmegaConf.merge(schema, task)
        except OmegaConfBaseException as e:
            key = getattr(e, "full_key", None) or "?"
            raise ConfigError(
                f"{where}: tasks.{i} ({name!r}) field {key}: {str(e).splitlines()[0]}"
            ) from e


def _compose_yaml(config_file: Path) -> DictConfig:
    """The main YAML through hydra, so `defaults:` lists and interpolation work."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(config_file.parent), version_base=None):
        return compose(config_name=config_file.stem)


def _apply_overrides(cfg: DictConfig, overrides: list[str]) -> None:
    """Hydra's own override semantics (``a.b=1``, ``+new=1``, ``~key``)."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(overrides=overrides)
    except Exception as e:  # hydra's grammar errors
        raise ConfigError(f"bad override syntax: {e}") from e
    try:
        ConfigLoaderImpl._apply_overrides_to_config(parsed, cfg)
    except OmegaConfBaseException:
        raise
    except Exception as e:
        cause = e.__cause__ if isinstance(e.__cause__, OmegaConfBaseException) else None
        if cause is not None:
            raise cause from e
        raise ConfigError(f"bad override: {e}") from e


def _name_task(msg: str, raw: DictConfig) -> str:
    """Append the task name to OmegaConf errors that point into ``tasks[i]``."""
    m = re.search(r"tasks\[(\d+)\]", msg)
    tasks = raw.get("tasks") if isinstance(raw, DictConfig) else None
    if m and isinstance(tasks, ListConfig) and int(m.group(1)) < len(tasks):
        name = tasks[int(m.group(1))].get("name", "?")
        return f"{msg} (task {name!r})"
    return msg


def parse_args(argv: list[str]) -> tuple[Path, str | None, list[str]]:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--config", required=True, help="Main YAML")
    parser.add_argument(
        "--tasks", default=None, help="Tasks YAML (overrides tasks_file)"
    )
    parser.add_argument(
        "--resume", action="store_true", help="Same as the override resume=true"
    )
    args, overrides = parser.parse_known_args(argv)
    if args.resume:
        overrides.append("resume=true")
    unknown = [o for o in overrides if o.startswith("--")]
    if unknown:
        raise ConfigError(
            f"unknown option(s) {unknown}; overrides look like key=value."
        )
    return Path(args.config).absolute(), args.tasks, overrides


def load_config(argv: list[str]) -> tuple[MARLaaSConfig, Path]:
    """``--config X.yaml [--tasks T.yaml] [key=value ...]`` -> validated config."""
    config_file, tasks_arg, overrides = parse_args(argv)
    if not config_file.is_file():
        raise ConfigError(f"--config: {config_file} does not exist.")
    raw = _compose_yaml(config_file)
    tasks_file = tasks_arg
    for o in overrides:
        if o.startswith(("tasks_file=", "+tasks_file=")) and not tasks_arg:
            tasks_file = o.split("=", 1)[1]
    tasks_file = tasks_file or raw.get("tasks_file") or ""
    if tasks_file:
        if raw.get("tasks"):
            raise ConfigError(
                "tasks are given twice: inline `tasks:` in the main YAML and a tasks "
                f"file ({tasks_file}); keep one."
            )
        path = _resolve_tasks_path(tasks_file, config_file)
        with open_dict(raw):
            raw.tasks = _load_tasks(path)
            raw.tasks_file = str(path)
    elif isinstance(raw.get("tasks"), ListConfig):
        _check_task_fields(raw.tasks, str(config_file))
    try:
        # Overrides go onto the typed config, so every field (defaults included)
        # takes `key=value`, and a misspelt key is rejected by the schema.
        structured = to_structured_cfg(raw, MARLaaSConfig)
        _apply_overrides(structured, [o for o in overrides if "tasks_file=" not in o])
        cfg = OmegaConf.to_object(structured)
    except OmegaConfBaseException as e:
        raise ConfigError(_name_task(str(e).split("\n")[0] + _key_of(e), raw)) from e
    except ValueError as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(str(e)) from e
    assert isinstance(cfg, MARLaaSConfig)
    return cfg, config_file


def _key_of(e: OmegaConfBaseException) -> str:
    key = getattr(e, "full_key", None)
    return f" [at {key}]" if key else ""
