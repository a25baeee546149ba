"""KV-cache footprint estimates: what one task's rollout batch needs on the server.

Prefix caching stays off (AReaL's RL default), so every sampled sequence holds its
own blocks for prompt + generation.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

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
            raise ValueError(f"unknown KV dtype {dtype!r}")
        return cls(
            layers=cfg["num_hidden_layers"],
            kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=head_dim,
            dtype_bytes=_DTYPE_BYTES[dtype],
            block_size=block_size,
        )

    def sequence_bytes(self, tokens: int) -> int:
        blocks = math.ceil(tokens / self.block_size)
        return blocks * self.block_size * self.bytes_per_token


def task_kv_bytes(
    kv: KVModel,
    prompt_tokens: int,
    max_new_tokens: int,
    batch_size: int,
    n_samples: int,
) -> int:
    """Worst-case KV bytes of one task's whole rollout batch in flight at once."""
    return kv.sequence_bytes(prompt_tokens + max_new_tokens) * batch_size * n_samples
