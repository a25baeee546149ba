"""Shared fixtures: the real default model, a real vLLM server from the vLLM venv,
and LoRA adapters with distinct weights."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.two_hosts import two_hosts  # noqa: F401 (a fixture for every test)

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(
    os.environ.get("MARLAAS_SHARED_DATA", REPO.parent / "shared" / "data")
)


@pytest.fixture(scope="session")
def model_path() -> Path:
    from areal_marlaas.model_prep import prepare_default_model

    return prepare_default_model()


@pytest.fixture(scope="session")
def vllm_server(model_path, tmp_path_factory):
    """One real multi-LoRA vLLM server for the whole test session."""
    from areal_marlaas.paths import vllm_python
    from areal_marlaas.rollout.server import (
        MultiLoRAvLLMConfig,
        RolloutServerConfig,
        VLLMServer,
    )

    if not Path(vllm_python()).exists():
        pytest.fail(
            f"no vLLM venv at {vllm_python()}: run `make setup` (or set "
            "MARLAAS_VLLM_PYTHON)"
        )
    # MARLAAS_TEST_VLLM: JSON of extra server settings, e.g. the GPU check's
    # {"dtype": "bfloat16", "enforce_eager": true, "gpu_memory_utilization": 0.3}.
    extra = json.loads(os.environ.get("MARLAAS_TEST_VLLM") or "{}")
    vllm_cfg = MultiLoRAvLLMConfig(
        max_loras=4,
        max_cpu_loras=16,
        max_lora_rank=8,
        max_model_len=1024,
        max_num_seqs=128,
        **extra,
    )
    server_cfg = RolloutServerConfig(cpu_kvcache_space_gib=2)
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    server = VLLMServer(str(model_path), vllm_cfg, server_cfg, log)
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def distinct_adapters(model_path, tmp_path_factory) -> list[Path]:
    """Four rank-8 adapters whose B matrices differ (seeds 0..3)."""
    from areal_marlaas.adapters import init_lora_adapter

    root = tmp_path_factory.mktemp("adapters")
    return [
        init_lora_adapter(model_path, root / f"a{i}", rank=8, seed=i, b_init_std=0.02)
        for i in range(4)
    ]


@pytest.fixture(scope="session")
def tokenizer(model_path):
    """The default model's tokenizer."""
    from areal.utils.hf_utils import load_hf_tokenizer

    return load_hf_tokenizer(str(model_path))
