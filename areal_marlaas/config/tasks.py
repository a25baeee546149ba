"""A tenant task's settings: its method, data, reward, GRPO knobs, and the search
environment."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from areal_marlaas.config.agent import AgentConfig
from areal_marlaas.errors import ConfigError
from areal_marlaas.methods import METHODS, Method
from areal_marlaas.tasks import KINDS
from areal_marlaas.tasks.search import SCORER_REWARD_FNS

# Task names become adapter names and folder names: keep them path- and URL-safe.
TASK_NAME = re.compile(r"^[a-z0-9][a-z0-9_]{0,47}$")
SEARCH_SCORERS = ("em", "f1", "judge")


@dataclass
class TaskDatasetConfig:
    """Where a task's prompts come from."""

    path: str = field(
        default="",
        metadata={
            "help": "jsonl/json file, folder with <split>.jsonl, or hub id. Empty for "
            "synthetic kinds (addition, multiplication, sorting)."
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
        default=2, metadata={"help": "Synthetic arithmetic: digits of the operands."}
    )
    digits2: int = field(
        default=0,
        metadata={
            "help": "Synthetic arithmetic: digits of the second operand; 0 = digits "
            "(e.g. digits=2 digits2=1: 2-digit x 1-digit)."
        },
    )
    items: int = field(
        default=4,
        metadata={"help": "Synthetic sorting: how many distinct numbers to sort."},
    )
    holdout: float = field(
        default=0.0,
        metadata={
            "help": "Synthetic kinds: fraction of the problem space kept for the "
            "held-out test split (by problem: a op b = b op a, a list in any "
            "order); split=train draws from the rest, split=test from it."
        },
    )
    format: str = field(
        default="kind",
        metadata={
            "help": "kind: the kind's own loader reads path; messages: path is a "
            'JSONL of {"messages": [... ending with a user turn], <fields>} lines, '
            "used as they are (a job's training file).",
            "choices": ["kind", "messages"],
        },
    )


@dataclass
class SearchConfig:
    """The search agent's environment (kind wiki_search): a BM25 corpus searched
    in process or over HTTP, the tool budget and how final answers are scored."""

    corpus_path: str = field(
        default="",
        metadata={
            "help": "jsonl corpus of {id, title, text} passages to search (not "
            "needed with an http(s) server_url)."
        },
    )
    server_url: str = field(
        default="",
        metadata={
            "help": "Where searches run: '' = in process (BM25 in a thread pool); "
            "http://host:port = a `marlaas search-server`; auto = the run starts "
            "one for corpus_path (with the latency_* settings) and stops it at "
            "the end."
        },
    )
    server_retries: int = field(
        default=2,
        metadata={
            "help": "Search server: retries after a connection error or a 5xx/429 "
            "reply, within tool_timeout_s."
        },
    )
    server_backoff_s: float = field(
        default=0.2,
        metadata={"help": "Search server: pause before the first retry (doubles)."},
    )
    server_workers: int = field(
        default=2,
        metadata={"help": "server_url=auto: worker processes of the server."},
    )
    latency_median_s: float = field(
        default=0.0,
        metadata={
            "help": "server_url=auto: injected log-normal delay per search, its "
            "median (0 = none); stands in for a web search API in benchmarks."
        },
    )
    latency_sigma: float = field(
        default=0.5,
        metadata={"help": "server_url=auto: log-normal shape of the delay."},
    )
    latency_seed: int | None = field(
        default=None,
        metadata={"help": "server_url=auto: seed of the delays; None = unseeded."},
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
        metadata={
            "help": f"Final-answer scorer: one of {list(SEARCH_SCORERS)}.",
            "choices": list(SEARCH_SCORERS),
        },
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

    @property
    def remote(self) -> bool:
        """Searches go to a server someone else runs (no local corpus needed)."""
        return self.server_url.startswith(("http://", "https://"))

    def _check_server(self, where: str) -> None:
        url = self.server_url
        if url not in ("", "auto") and not self.remote:
            raise ConfigError(
                f"{where}: search.server_url must be '' (in process), auto or "
                f"http(s)://host:port, got {url!r}."
            )
        if url == "auto" and not self.corpus_path:
            raise ConfigError(
                f"{where}: search.server_url=auto needs search.corpus_path (the "
                "corpus the started server searches)."
            )
        if self.server_retries < 0:
            raise ConfigError(f"{where}: search.server_retries must be >= 0.")
        if self.server_backoff_s < 0:
            raise ConfigError(f"{where}: search.server_backoff_s must be >= 0.")
        if self.server_workers < 1:
            raise ConfigError(f"{where}: search.server_workers must be >= 1.")
        if self.latency_median_s < 0 or self.latency_sigma < 0:
            raise ConfigError(
                f"{where}: search.latency_median_s and search.latency_sigma must "
                "be >= 0."
            )
        if self.latency_median_s > 0 and url != "auto":
            raise ConfigError(
                f"{where}: search.latency_median_s is injected by the server the run "
                "starts: set search.server_url=auto (or run `marlaas search-server "
                "--latency-median-s ...` yourself and point search.server_url at it)."
            )

    def check(self, where: str) -> None:
        """Raise ``ConfigError`` naming the first bad ``search.*`` field."""
        if self.top_k < 1:
            raise ConfigError(f"{where}: search.top_k must be >= 1, got {self.top_k}.")
        if self.max_tool_calls < 0:
            raise ConfigError(f"{where}: search.max_tool_calls must be >= 0.")
        if not self.tool_timeout_s > 0:
            raise ConfigError(f"{where}: search.tool_timeout_s must be > 0.")
        self._check_server(where)
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
class TaskPPOConfig:
    """Per-task overrides of AReaL's PPO settings (``actor.*``); ``None`` keeps the
    actor's value. Every field here reaches the task's own PPO actor."""

    eps_clip: float | None = field(
        default=None, metadata={"help": "PPO ratio clip (actor.eps_clip)."}
    )
    eps_clip_higher: float | None = field(
        default=None,
        metadata={
            "help": "Upper ratio clip, DAPO clip-higher (actor.eps_clip_higher)."
        },
    )
    c_clip: float | None = field(
        default=None, metadata={"help": "Dual-clip constant (actor.c_clip)."}
    )
    ppo_n_minibatches: int | None = field(
        default=None,
        metadata={
            "help": "Optimizer steps per on-policy batch (actor.ppo_n_minibatches); "
            "the task still commits one version per batch."
        },
    )
    reward_scaling: float | None = field(
        default=None, metadata={"help": "Reward scale (actor.reward_scaling)."}
    )
    reward_bias: float | None = field(
        default=None, metadata={"help": "Reward bias (actor.reward_bias)."}
    )
    reward_clip: float | None = field(
        default=None, metadata={"help": "Reward clip (actor.reward_clip)."}
    )
    mask_no_eos_with_zero: bool | None = field(
        default=None,
        metadata={
            "help": "Zero the loss of truncated samples (actor.mask_no_eos_with_zero)."
        },
    )

    def check(self, where: str) -> None:
        for key in ("eps_clip", "eps_clip_higher", "c_clip"):
            value = getattr(self, key)
            if value is not None and not value > 0:
                raise ConfigError(f"{where}: ppo.{key} must be > 0, got {value}.")
        if self.ppo_n_minibatches is not None and self.ppo_n_minibatches < 1:
            raise ConfigError(
                f"{where}: ppo.ppo_n_minibatches must be >= 1, got "
                f"{self.ppo_n_minibatches}."
            )
        if self.reward_clip is not None and not self.reward_clip > 0:
            raise ConfigError(f"{where}: ppo.reward_clip must be > 0.")

    def overrides(self) -> dict:
        return {k: v for k, v in vars(self).items() if v is not None}


@dataclass
class TaskSpec:
    """One tenant task: its own LoRA adapter, data, reward and GRPO settings."""

    name: str = field(
        default=MISSING,
        metadata={"help": "Unique id: lowercase letters, digits, '_' (max 48)."},
    )
    method: str = field(
        default="grpo",
        metadata={
            "help": "What its steps optimize. grpo: rollouts on the shared server "
            "scored by its reward; sft: the demonstrations in dataset.path (chat "
            "rows ending with the assistant's turn, loss on assistant turns of "
            "weight 1); dpo: the preference pairs in dataset.path (OpenAI's "
            "input/preferred_output/non_preferred_output rows). sft and dpo do "
            "not roll out; eval_dataset is then their validation set (a "
            "batch_size draw scored after each step, all of it after the last); "
            "an example over max_prompt_tokens + max_new_tokens tokens is refused.",
            "choices": list(METHODS),
        },
    )
    beta: float = field(
        default=0.1,
        metadata={
            "help": "method dpo: the preference loss's beta (> 0; how far the "
            "adapter may move from its reference, the adapter it started from)."
        },
    )
    init_adapter: str = field(
        default="",
        metadata={
            "help": "A PEFT adapter folder the task's adapter starts from (an "
            "earlier fine-tune: continued training, a fresh optimizer); for dpo "
            "also its reference. Empty = a fresh adapter (B = 0)."
        },
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
    agent: AgentConfig = field(
        default_factory=AgentConfig,
        metadata={"help": "Tool-agent settings (tools on the tenant's endpoints)."},
    )
    reward_fn: str = field(
        default="",
        metadata={
            "help": "Import path of fn(prompt, completions, ..., **row); "
            "empty = the kind's default."
        },
    )
    grader: dict[str, Any] | None = field(
        default=None,
        metadata={
            "help": "An OpenAI-style grader (string_check, text_similarity, python, "
            "score_model, multi) scoring each sample instead of reward_fn; its "
            "templates read {{ item.<field> }} of the row and "
            "{{ sample.output_text }}."
        },
    )
    eval_dataset: TaskDatasetConfig | None = field(
        default=None,
        metadata={
            "help": "Held-out prompts (marlaas bench-learning evaluates on them), "
            "e.g. {split: test, holdout: 0.2} of the same arithmetic kind or "
            "another file of the same format; None = none."
        },
    )
    eval_interval: int = field(
        default=0,
        metadata={
            "help": "Evaluate on eval_dataset after every eval_interval-th committed "
            "step and after the last, beside the task's next rollout (results in "
            "the run directory's evals.jsonl and on the screen); 0 = no evals."
        },
    )
    eval_samples: int = field(
        default=32,
        metadata={
            "help": "Held-out rows per eval: one seeded draw of eval_dataset (the "
            "same rows every time), one sample each."
        },
    )
    ppo: TaskPPOConfig = field(
        default_factory=TaskPPOConfig,
        metadata={"help": "This task's overrides of actor.* PPO settings."},
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
    tenant: str = field(
        default="",
        metadata={
            "help": "Whose fair share its training steps count toward under "
            "scheduler.train_order=fair; tasks with the same tenant share one "
            "share. Empty = the task is its own tenant."
        },
    )
    weight: float = field(
        default=1.0,
        metadata={
            "help": "Its tenant's weight under scheduler.train_order=fair: a "
            "weight-2 tenant gets twice the trainer time of a weight-1 one while "
            "both have batches waiting (> 0; tasks of one tenant must agree)."
        },
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
        if self.method not in METHODS:
            raise ConfigError(
                f"{where}: method must be one of {list(METHODS)}, got {self.method!r}."
            )
        if not Method(self.method).rolls_out:
            self._check_examples(where)
            return
        if not self.kind and not self.workflow and self.grader is None:
            raise ConfigError(
                f"{where}: set kind (one of {sorted(KINDS)}), grader, or workflow "
                "(import path)."
            )
        if self.kind and self.kind not in KINDS:
            raise ConfigError(
                f"{where}: unknown kind {self.kind!r}; choose one of {sorted(KINDS)} "
                "or set workflow to an import path."
            )
        if self.dataset.format not in ("kind", "messages"):
            raise ConfigError(
                f"{where}: dataset.format must be kind or messages, got "
                f"{self.dataset.format!r}."
            )
        if self.grader is not None:
            self._check_grader(where)
        if not self.kind:
            if not self.reward_fn and self.grader is None:
                raise ConfigError(
                    f"{where}: reward_fn (or grader) is required when kind is empty."
                )
            if not self.dataset.path:
                raise ConfigError(
                    f"{where}: dataset.path is required when kind is empty."
                )
        elif KINDS[self.kind].needs_path and not self.dataset.path:
            raise ConfigError(
                f"{where}: kind {self.kind!r} needs dataset.path (a file, a folder "
                "with <split>.jsonl, or a hub id)."
            )
        if (
            self.kind
            and KINDS[self.kind].needs_search
            and not self.search.corpus_path
            and not self.search.remote
        ):
            raise ConfigError(
                f"{where}: kind {self.kind!r} needs search.corpus_path (a jsonl of "
                "{id, title, text} passages) or an http(s) search.server_url."
            )
        self.search.check(where)
        self.agent.check(where)
        if self.agent.enabled and (
            self.workflow or (self.kind and KINDS[self.kind].workflow)
        ):
            raise ConfigError(
                f"{where}: agent.tools runs the tool agent; leave workflow empty and "
                "use a kind without its own workflow (or none)."
            )
        self.ppo.check(where)
        self._check_shared(where)
        if self.n_samples < 2:
            raise ConfigError(
                f"{where}: n_samples must be >= 2 (GRPO normalizes rewards within "
                f"each prompt's group), got {self.n_samples}."
            )
        if not 0 < self.temperature <= 2:
            raise ConfigError(
                f"{where}: temperature must be in (0, 2], got {self.temperature}."
            )
        if self.reward_timeout_s < 0:
            raise ConfigError(f"{where}: reward_timeout_s must be >= 0.")
        self._check_eval(where)
        for key, ds in (("dataset", self.dataset), ("eval_dataset", self.eval_dataset)):
            if ds is None:
                continue
            if not 1 <= ds.digits <= 9 or not 0 <= ds.digits2 <= 9:
                raise ConfigError(
                    f"{where}: {key}.digits must be in [1, 9] and digits2 in [0, 9]."
                )
            if not 0 <= ds.holdout < 1:
                raise ConfigError(f"{where}: {key}.holdout must be in [0, 1).")
            problem = KINDS[self.kind].check(ds) if self.kind in KINDS else ""
            if problem:
                raise ConfigError(f"{where}: {key}.{problem}")

    def _check_examples(self, where: str) -> None:
        """An SFT or DPO task: its examples and the fields its steps read; the
        reinforcement-only ones must be left unset."""
        rl_only = {
            "kind": self.kind,
            "workflow": self.workflow,
            "reward_fn": self.reward_fn,
            "grader": self.grader,
            "agent.tools": self.agent.tools,
            "eval_interval": self.eval_interval,
        }
        for key, value in rl_only.items():
            if value:
                raise ConfigError(
                    f"{where}: {key} is for method grpo; an {self.method} task "
                    "trains on dataset.path's examples (leave it unset)."
                )
        if not self.dataset.path:
            raise ConfigError(
                f"{where}: method {self.method} needs dataset.path (a JSONL of "
                + (
                    '{"messages": [..., {"role": "assistant", ...}]} rows).'
                    if self.method == Method.SFT
                    else '{"input": {"messages": [...]}, "preferred_output": '
                    '[...], "non_preferred_output": [...]} rows).'
                )
            )
        if not (self.beta > 0 and math.isfinite(self.beta)):
            raise ConfigError(f"{where}: beta must be > 0, got {self.beta}.")
        self._check_shared(where)

    def _check_shared(self, where: str) -> None:
        """The sizes, learning rate and weight every method reads."""
        positive = {
            "batch_size": self.batch_size,
            "max_new_tokens": self.max_new_tokens,
            "max_prompt_tokens": self.max_prompt_tokens,
            "total_steps": self.total_steps,
        }
        for key, value in positive.items():
            if value < 1:
                raise ConfigError(f"{where}: {key} must be >= 1, got {value}.")
        if not self.lr > 0:
            raise ConfigError(f"{where}: lr must be > 0, got {self.lr}.")
        if not self.weight > 0:
            raise ConfigError(
                f"{where}: weight must be > 0 (a tenant's share of the trainer "
                f"under train_order=fair), got {self.weight}."
            )
        if self.dataset.size < 0:
            raise ConfigError(f"{where}: dataset.size must be >= 0.")

    @property
    def max_example_tokens(self) -> int:
        """The longest supervised example accepted."""
        return self.max_prompt_tokens + self.max_new_tokens

    def _check_eval(self, where: str) -> None:
        if not isinstance(self.eval_interval, int) or self.eval_interval < 0:
            raise ConfigError(
                f"{where}: eval_interval must be an integer >= 0 (0 = no evals), "
                f"got {self.eval_interval!r}."
            )
        if not isinstance(self.eval_samples, int) or self.eval_samples < 1:
            raise ConfigError(
                f"{where}: eval_samples must be an integer >= 1, got "
                f"{self.eval_samples!r}."
            )
        if self.eval_interval and self.eval_dataset is None:
            raise ConfigError(
                f"{where}: eval_interval={self.eval_interval} needs eval_dataset "
                "(held-out rows, e.g. {split: test, holdout: 0.2} of an arithmetic "
                "kind or another file of the same format); or set eval_interval=0."
            )

    def _check_grader(self, where: str) -> None:
        from areal_marlaas.graders import GraderError, parse_grader

        if self.reward_fn:
            raise ConfigError(f"{where}: set grader or reward_fn, not both.")
        assert self.grader is not None  # checked by the caller
        try:
            parse_grader(dict(self.grader), param="grader")
        except GraderError as e:
            raise ConfigError(f"{where}: {e.param}: {e}") from e

    @property
    def reward_fn_path(self) -> str:
        if self.reward_fn:
            return self.reward_fn
        if self.grader is not None:
            return "areal_marlaas.graders.reward.GraderReward"
        if KINDS[self.kind].needs_search and self.search.scorer in SCORER_REWARD_FNS:
            return SCORER_REWARD_FNS[self.search.scorer]
        return KINDS[self.kind].reward_fn
