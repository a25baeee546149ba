"""``MARLaaSConfig``: AReaL's GRPOConfig for many tenant tasks on one base model.

AReaL fields the multi-task trainer cannot honor are refused here with the field
named (``UNHONORED``); every other AReaL field is honored, and the PPO ones also
per task (``tasks[i].ppo``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from areal.api.cli_args import (
    ClusterSpecConfig,
    EvaluatorConfig,
    GRPOConfig,
    InferenceEngineConfig,
    MicroBatchSpec,
    OptimizerConfig,
    PPOActorConfig,
    RecoverConfig,
    SaverConfig,
    StatsLoggerConfig,
    TrainDatasetConfig,
)

from areal_marlaas.adapters import VLLM_LORA_RANKS
from areal_marlaas.config.audit import AuditConfig
from areal_marlaas.config.fault import FaultToleranceConfig
from areal_marlaas.config.scheduler import MARLaaSSchedulerConfig
from areal_marlaas.config.server import MultiLoRAvLLMConfig, RolloutServerConfig
from areal_marlaas.config.tasks import TaskSpec
from areal_marlaas.errors import ConfigError
from areal_marlaas.paths import default_model_path

# Nested AReaL configs take the run names from the top level unless a YAML says
# otherwise.
# Any: each is splatted into an AReaL config whose fields differ in type.
_RUN: dict[str, Any] = {
    "experiment_name": "${experiment_name}",
    "trial_name": "${trial_name}",
}
_RUN_ROOT: dict[str, Any] = {**_RUN, "fileroot": "${cluster.fileroot}"}
_ACTOR_DEFAULTS: dict[str, Any] = dict(
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
    kl_ctl=0.0,
    # A step's memory grows with its tokens (the logits alone are tokens x vocab
    # floats): a tenant's batch of 160 completions took 16 GiB in one pass. Capped
    # passes keep a large batch from taking the shared trainer down.
    mb_spec=MicroBatchSpec(max_tokens_per_mb=2048),
    # Per-task lr comes from tasks[i].lr; the rest of AdamW's settings from here.
    optimizer=OptimizerConfig(lr=1e-4, weight_decay=0.0, gradient_clipping=1.0),
)
_ROLLOUT_DEFAULTS: dict[str, Any] = dict(
    **_RUN,
    backend="vllm:d1",
    use_lora=True,
    max_head_offpolicyness=0,
    max_concurrent_rollouts=256,
)

# Top-level GRPOConfig sections the multi-task trainer never reads: each task
# names its data, reward, generation settings and steps, and `--resume` replaces
# AReaL's recover. Setting one is refused (field -> the fix).
_UNUSED_SECTIONS = {
    "gconfig": "set tasks[i].max_new_tokens / temperature / n_samples",
    "eval_gconfig": "evaluation is not run by marlaas train",
    "train_dataset": "set tasks[i].dataset",
    "valid_dataset": "evaluation is not run by marlaas train",
    "ref": "there is no reference model (actor.kl_ctl must be 0)",
    "critic": "GRPO uses no critic",
    "teacher": "distillation is not supported",
    "total_train_epochs": "set tasks[i].total_steps",
    "total_train_steps": "set tasks[i].total_steps",
    "total_train_n_seqs": "set tasks[i].total_steps",
    "dynamic_bs": "each task's batch is tasks[i].batch_size x n_samples",
    "allocation_mode": "use actor.backend and rollout.backend",
    "enable_offload": "the shared server is never offloaded",
    "sglang": "the rollout server is vLLM (vllm.*)",
    "seed": "set tasks[i].seed",
    "perf_tracer": "not wired into marlaas train",
    "memory_profiler": "not wired into marlaas train",
}
# Fields of nested sections: (section, field) -> (allowed values, the fix).
UNHONORED: dict[tuple[str, str], tuple[tuple[Any, ...], str]] = {
    ("actor", "kl_ctl"): ((0, 0.0), "there is no reference model; keep it 0"),
    ("actor", "temperature"): ((1.0,), "set tasks[i].temperature"),
    ("actor", "max_new_tokens"): ((1024,), "set tasks[i].max_new_tokens"),
    ("actor", "reward_norm"): (
        (None,),
        "GRPO normalizes rewards within each prompt's group of tasks[i].n_samples",
    ),
    ("actor", "use_lora"): ((True,), "every task is a LoRA adapter"),
    ("actor", "weight_update_mode"): (("disk",), "adapters are published from disk"),
    ("rollout", "max_head_offpolicyness"): (
        (0,),
        "tasks are strictly on-policy; the scheduler enforces it per task",
    ),
    ("rollout", "use_lora"): ((True,), "every task is a LoRA adapter"),
    ("rollout", "lora_name"): (("",), "each task routes to its own adapter"),
    ("rollout", "consumer_batch_size"): ((1,), "set tasks[i].batch_size"),
    ("rollout", "pause_grace_period"): (
        (0, 0.0),
        "the server is never paused (a new adapter version is a new name)",
    ),
    ("rollout", "return_routed_experts"): ((False,), "not collected"),
    ("saver", "freq_epochs"): ((None,), "every step is committed (run directory)"),
    ("saver", "freq_steps"): ((None,), "every step is committed (run directory)"),
    ("saver", "freq_secs"): ((None,), "every step is committed (run directory)"),
    ("evaluator", "freq_epochs"): ((None,), "evaluation is not run by marlaas train"),
    ("evaluator", "freq_steps"): ((None,), "evaluation is not run by marlaas train"),
    ("evaluator", "freq_secs"): ((None,), "evaluation is not run by marlaas train"),
    ("recover", "mode"): (("disabled",), "use marlaas train --resume"),
}


@dataclass
class MARLaaSConfig(GRPOConfig):
    """GRPOConfig for many tenant tasks sharing one base model (one LoRA per task).

    Compared with GRPOConfig, the run-name plumbing of the nested configs
    (saver, stats_logger, actor, ...) defaults to the top-level names, so a YAML
    only needs ``experiment_name``, ``trial_name`` and the tasks.
    """

    # Whether a config without tasks is an error (the service adds them later).
    needs_tasks: ClassVar[bool] = True

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
    # Narrows AReaL's field to a subclass; nothing assigns the base type to it.
    vllm: MultiLoRAvLLMConfig = field(  # pyright: ignore[reportIncompatibleVariableOverride]
        default_factory=MultiLoRAvLLMConfig,
        metadata={"help": "The server's vLLM flags (AReaL's vLLMConfig + LoRA)."},
    )
    fault: FaultToleranceConfig = field(
        default_factory=FaultToleranceConfig,
        metadata={"help": "Server supervision, tenant guards, adapter retention."},
    )
    audit: AuditConfig = field(
        default_factory=AuditConfig,
        metadata={"help": "The per-step staleness audit (server vs trainer)."},
    )
    resume: bool = field(
        default=False,
        metadata={
            "help": "Continue every task of the run directory from its last "
            "committed version (also `marlaas train --resume`)."
        },
    )
    verbose: bool = field(
        default=False,
        metadata={
            "help": "Print AReaL's banners and per-step stats tables on the screen "
            "too (they always go to the run directory's logs)."
        },
    )
    keep_freed_pages: bool = field(
        default=True,
        metadata={
            "help": "Trainer processes keep the memory they free (glibc malloc: one "
            "arena, no mmap for large blocks, no trimming), so a train step reuses "
            "the last step's pages instead of faulting in ~1.4 GB of fresh ones "
            "(faster steps on CPU; docs/results.md measures it). The update "
            "is unchanged; the trainer's RSS stays at its peak. Read before torch "
            "starts threads (train/heap.py). false = glibc's defaults."
        },
    )
    cluster: ClusterSpecConfig = field(
        default_factory=lambda: ClusterSpecConfig(fileroot="/tmp/areal-marlaas"),
        metadata={
            "help": "AReaL's cluster settings; runs live under "
            "<cluster.fileroot>/<experiment_name>/<trial_name>."
        },
    )
    actor: PPOActorConfig = field(
        default_factory=lambda: PPOActorConfig(**_ACTOR_DEFAULTS),
        metadata={
            "help": "AReaL's PPO actor (each trainer worker). Defaults differ from "
            "AReaL's: LoRA rank 8 on all linear layers, float32, sdpa, disk weight "
            "updates, one optimizer step per batch, no KL (no reference model)."
        },
    )
    rollout: InferenceEngineConfig = field(
        default_factory=lambda: InferenceEngineConfig(**_ROLLOUT_DEFAULTS),
        metadata={
            "help": "AReaL's inference engine settings (request timeouts, "
            "concurrency); max_head_offpolicyness stays 0: each task is on-policy."
        },
    )
    train_dataset: TrainDatasetConfig = field(
        default_factory=lambda: TrainDatasetConfig(path="", type="rl"),
        metadata={"help": "Refused: each task names its own dataset."},
    )
    saver: SaverConfig = field(
        default_factory=lambda: SaverConfig(**_RUN_ROOT),
        metadata={"help": "Refused freq_*: every step is committed to the run dir."},
    )
    evaluator: EvaluatorConfig = field(
        default_factory=lambda: EvaluatorConfig(**_RUN_ROOT),
        metadata={"help": "Refused freq_*: marlaas train runs no evaluation."},
    )
    stats_logger: StatsLoggerConfig = field(
        default_factory=lambda: StatsLoggerConfig(**_RUN_ROOT),
        metadata={
            "help": "AReaL's stats logger (tensorboard, wandb, ...): every "
            "committed step's metrics."
        },
    )
    recover: RecoverConfig = field(
        default_factory=lambda: RecoverConfig(**_RUN_ROOT),
        metadata={"help": "Refused (mode must stay disabled): use --resume."},
    )
    # Narrows AReaL's field to a subclass; nothing assigns the base type to it.
    scheduler: MARLaaSSchedulerConfig = field(  # pyright: ignore[reportIncompatibleVariableOverride]
        default_factory=lambda: MARLaaSSchedulerConfig(type="local"),
        metadata={
            "help": "AReaL's scheduler (type local|ray|slurm|null) and "
            "how tasks share the server and the trainer."
        },
    )

    def __post_init__(self):
        self._refuse_unhonored()  # before AReaL derives eval_gconfig from gconfig
        super().__post_init__()
        if not self.actor.path:
            self.actor.path = str(default_model_path())
        if not self.tokenizer_path:
            self.tokenizer_path = self.actor.path
        if not self.vllm.model:
            self.vllm.model = self.actor.path
        if self.scheduler.rollout_order == "fair":
            # The server must order requests by the priority they carry.
            self.vllm.scheduling_policy = "priority"
        if not self.tasks and self.needs_tasks:
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
        weights: dict[str, float] = {}
        for i, task in enumerate(self.tasks):
            tenant = task.tenant or task.name
            if weights.setdefault(tenant, task.weight) != task.weight:
                raise ConfigError(
                    f"tasks.{i}.weight: tenant {tenant!r} has weight "
                    f"{weights[tenant]} on an earlier task and {task.weight} here; "
                    "a tenant has one weight."
                )
        self._check_lora_slot()
        self._check_lengths()
        if self.server.launch == "workers" and self.scheduler.type is None:
            raise ConfigError(
                "server.launch=workers needs rollout workers (scheduler.type=local|"
                "ray|slurm); with scheduler.type=null set server.launch=driver."
            )
        if self.fault.deterministic:
            # The server's logprobs depend on what it batched (~1e-5); the
            # trainer's own are a function of the tokens alone.
            self.actor.recompute_logprob = True

    @property
    def run_dir(self) -> Path:
        """``<cluster.fileroot>/<experiment_name>/<trial_name>``: the run store."""
        return Path(self.cluster.fileroot) / self.experiment_name / self.trial_name

    def _refuse_unhonored(self) -> None:
        """AReaL fields this trainer would silently ignore are errors instead."""
        for f in dataclasses.fields(self):
            if f.name not in _UNUSED_SECTIONS:
                continue
            factory = f.default_factory
            default = factory() if callable(factory) else f.default
            value = getattr(self, f.name)
            if f.name == "eval_gconfig" and value == self.gconfig:
                continue  # what AReaL derives when it is unset
            if value != default:
                raise ConfigError(
                    f"{f.name} is not used by marlaas (it would be ignored): "
                    f"{_UNUSED_SECTIONS[f.name]}. Remove {f.name} from the config."
                )
        for (section, key), (allowed, fix) in UNHONORED.items():
            value = getattr(getattr(self, section), key)
            if (section, key) == ("rollout", "lora_name") and value == (
                self.gconfig.lora_name
            ):
                continue  # what AReaL derives from gconfig when it is unset
            if value not in allowed:
                raise ConfigError(
                    f"{section}.{key}={value!r} cannot be honored by the multi-task "
                    f"trainer: {fix}. Allowed: {list(allowed)}."
                )

    def _check_lora_slot(self) -> None:
        actor = self.actor
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
        per_mb = self.actor.mb_spec.max_tokens_per_mb
        if per_mb is not None and (limit is None or limit > per_mb):
            raise ConfigError(
                f"actor.mb_spec.max_tokens_per_mb={per_mb} is below "
                f"vllm.max_model_len={limit or 'unset (the model length)'}: a "
                "sequence of that length fits no micro-batch; raise "
                "actor.mb_spec.max_tokens_per_mb or lower vllm.max_model_len."
            )
        for i, task in enumerate(self.tasks):
            need = task.max_prompt_tokens + task.max_new_tokens
            if limit is not None and need > limit:
                raise ConfigError(
                    f"tasks.{i} ({task.name!r}): max_prompt_tokens + max_new_tokens = "
                    f"{need} exceeds vllm.max_model_len={limit}; lower them or raise "
                    "vllm.max_model_len."
                )
