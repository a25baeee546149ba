"""KV-cache admission inputs, in one place: what a task's rollout batch needs on
the server, what the server holds, the budget, and the live usage probe.

``marlaas check``, the trainer, the bench and the service all call these; the
decisions themselves are the scheduling core's (``scheduler/core.py``).

Prefix caching stays off (AReaL's RL default), so every sampled sequence holds its
own blocks for prompt + generation.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from areal.utils import logging

from areal_marlaas.config import ConfigError, MARLaaSConfig, TaskSpec
from areal_marlaas.methods import Method
from areal_marlaas.rollout.platform import resolve_platform, server_block_size
from areal_marlaas.rollout.server_metrics import capacity_tokens, scrape

logger = logging.getLogger("MARLaaSAdmission")

_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "half": 2, "float": 4}


@dataclass(frozen=True)
class KVModel:
    """Per-token KV size of a model as served: ``2 x layers x kv_heads x head_dim x
    dtype bytes``, allocated in blocks of ``block_size`` tokens."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int
    block_size: int

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    @classmethod
    def from_model_dir(cls, path: str | Path, dtype: str, block_size: int) -> KVModel:
        cfg = json.loads((Path(path) / "config.json").read_text())
        cfg = cfg.get("text_config", cfg)
        heads = cfg["num_attention_heads"]
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
        if dtype == "auto":
            dtype = cfg.get("dtype") or cfg.get("torch_dtype") or "bfloat16"
        if dtype not in _DTYPE_BYTES:
            raise ConfigError(
                f"vllm.dtype={dtype!r}: unknown KV dtype; use one of "
                f"{sorted(_DTYPE_BYTES)}."
            )
        return cls(
            layers=cfg["num_hidden_layers"],
            kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=head_dim,
            dtype_bytes=_DTYPE_BYTES[dtype],
            block_size=block_size,
        )

    @classmethod
    def for_config(cls, cfg: MARLaaSConfig) -> KVModel:
        """The served model of ``cfg``, in the block size its platform uses."""
        block = server_block_size(cfg.vllm.block_size, resolve_platform(cfg.server))
        return cls.from_model_dir(cfg.actor.path, cfg.vllm.dtype, block)

    def sequence_bytes(self, tokens: int) -> int:
        blocks = math.ceil(tokens / self.block_size)
        return blocks * self.block_size * self.bytes_per_token

    def task_bytes(self, task: TaskSpec) -> int:
        """Worst-case KV bytes of the task's whole rollout batch in flight
        (none for a method that does not roll out)."""
        if not Method(task.method).rolls_out:
            return 0
        return task_kv_bytes(
            self,
            task.max_prompt_tokens,
            task.max_new_tokens,
            task.batch_size,
            task.n_samples,
        )

    def eval_bytes(self, task: TaskSpec) -> int:
        """Worst-case KV bytes of one of the task's evals (one sample a row)."""
        return task_kv_bytes(
            self, task.max_prompt_tokens, task.max_new_tokens, task.eval_samples, 1
        )


def task_kv_bytes(
    kv: KVModel,
    prompt_tokens: int,
    max_new_tokens: int,
    batch_size: int,
    n_samples: int,
) -> int:
    """Worst-case KV bytes of one task's whole rollout batch in flight at once."""
    return kv.sequence_bytes(prompt_tokens + max_new_tokens) * batch_size * n_samples


def configured_capacity(cfg: MARLaaSConfig) -> int | None:
    """The KV cache a server launched from ``cfg`` gets, when the config alone
    says it (a CPU server: ``server.cpu_kvcache_space_gib``); None when only the
    server knows (GPU/NPU memory profiling, or an attached server)."""
    if cfg.server.addresses or resolve_platform(cfg.server) != "cpu":
        return None
    return int(cfg.server.cpu_kvcache_space_gib * 2**30)


def capacity(cfg: MARLaaSConfig, kv: KVModel, address: str | None) -> int | None:
    """KV-cache bytes the server holds: its own report (``cache_config_info``),
    else what the config gives a launched CPU server; None when unknown."""
    if address:
        try:
            tokens = capacity_tokens(scrape(address))
        except Exception as e:  # an attached server without /metrics
            logger.warning(f"cannot read the KV capacity of {address}: {e}")
            tokens = None
        if tokens:
            return tokens * kv.bytes_per_token
    return configured_capacity(cfg)


def budget(cfg: MARLaaSConfig, capacity_bytes: int | None) -> int | None:
    """``scheduler.kv_budget_bytes``, else ``kv_budget_fraction`` of the capacity;
    None (unlimited) when neither is known."""
    sched = cfg.scheduler
    if sched.kv_budget_bytes:
        return sched.kv_budget_bytes
    if capacity_bytes is None:
        return None
    return int(capacity_bytes * sched.kv_budget_fraction)


def usage_probe(address: str, capacity_bytes: int) -> Callable[[], int | None]:
    """Bytes of KV the server reports in use (None when it cannot be read)."""

    def probe() -> int | None:
        try:
            return int(scrape(address, timeout=2).kv_cache_usage * capacity_bytes)
        except Exception:
            return None

    return probe
