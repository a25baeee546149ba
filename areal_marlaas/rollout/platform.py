"""Which accelerator the rollout server runs on, and what that implies."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from areal_marlaas.config.server import RolloutServerConfig

# KV block sizes the attention backends accept: CPU attention needs multiples of 32,
# vLLM-Ascend works in 128-token blocks (its default).
_BLOCK_MULTIPLE = {"cpu": 32, "npu": 128}


def detect_platform() -> str:
    """The accelerator this machine would give the server."""
    if Path("/dev/davinci0").exists() or os.environ.get("ASCEND_RT_VISIBLE_DEVICES"):
        return "npu"
    if Path("/dev/nvidia0").exists() or shutil.which("nvidia-smi"):
        return "cuda"
    return "cpu"


def resolve_platform(server: RolloutServerConfig) -> str:
    return detect_platform() if server.platform == "auto" else server.platform


def server_block_size(block_size: int, platform: str) -> int:
    """The configured block size rounded up to what the platform's backend takes."""
    multiple = _BLOCK_MULTIPLE.get(platform, 1)
    return -(-block_size // multiple) * multiple
