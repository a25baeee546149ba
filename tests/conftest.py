"""Fixtures every kind of test may use: the real default model, one real vLLM
server for the whole session, LoRA adapters with distinct weights, the
tokenizer, the environment of a one-rank FSDP engine in this process, and a
PostgreSQL server. What they are built from lives in
``tests/support``."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from areal.utils.network import find_free_ports

from tests.support import leftovers
from tests.support import postgres as pg


@pytest.fixture(scope="session", autouse=True)
def no_process_left_behind():
    """Fails the session if a test left a process running: a killed run's
    workers, a server its launcher did not stop, a pool nobody shut down
    (``tests/support/leftovers.py``). Torn down last of the session's fixtures."""
    watching = leftovers.become_subreaper()
    tests = leftovers.Tests()
    yield tests
    if watching:
        left = leftovers.leftovers(tests)
        assert not left, "processes left running:\n" + "\n".join(left)


@pytest.fixture(autouse=True)
def _test_window(request, no_process_left_behind):
    start = time.time()
    yield
    no_process_left_behind.windows.append((request.node.nodeid, start, time.time()))


@pytest.fixture(scope="session")
def model_path() -> Path:
    from areal_marlaas.model_prep import prepare_default_model

    return prepare_default_model()


@pytest.fixture(scope="session")
def vllm_server(model_path, tmp_path_factory):
    """One real multi-LoRA vLLM server for the whole test session, with the
    service's settings (configs/service.yaml) and priority scheduling, which is
    first come, first served at equal priority: every test that does not kill
    or restart its server attaches here, the live services included."""
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
        **{
            "max_loras": 8,
            "max_cpu_loras": 24,
            "max_lora_rank": 8,
            "max_model_len": 1024,
            "max_num_seqs": 128,
            "scheduling_policy": "priority",
            **extra,
        }
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


@pytest.fixture(scope="module")
def single_rank_env():
    """One rank's rendezvous variables, for modules that build the FSDP engine
    in this process (``pytestmark = pytest.mark.usefixtures(...)``)."""
    env = dict(WORLD_SIZE="1", RANK="0", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        env["MASTER_PORT"] = str(find_free_ports(1)[0])
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    yield
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="session")
def postgres():
    """A throwaway PostgreSQL server: (socket folder, port). Skipped where none
    can be started, unless MARLAAS_REQUIRE_POSTGRES=1 (CI) makes that a
    failure."""
    reason = pg.why_not()
    if reason is not None:
        if os.environ.get("MARLAAS_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"PostgreSQL is required here: {reason}")
        pytest.skip(reason)
    server = pg.start()
    yield server
    pg.stop(server)
