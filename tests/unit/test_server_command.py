"""The vLLM (and vLLM-Ascend) server command line, without starting anything."""

from __future__ import annotations

import pytest

from areal_marlaas.rollout.server import (
    VLLM_PLUGIN_DIR,
    MultiLoRAvLLMConfig,
    RolloutServerConfig,
    build_server_command,
)


def flags(argv: list[str]) -> dict[str, str | bool]:
    out, i = {}, 0
    while i < len(argv):
        if argv[i].startswith("--"):
            nxt = argv[i + 1] if i + 1 < len(argv) else "--"
            if nxt.startswith("--"):
                out[argv[i]] = True
                i += 1
            else:
                out[argv[i]] = nxt
                i += 2
        else:
            i += 1
    return out


def build(platform: str, **server):
    cfg = MultiLoRAvLLMConfig(max_loras=6, max_lora_rank=16)
    srv = RolloutServerConfig(python="/venv/bin/python", **server)
    return build_server_command("/models/m", cfg, srv, port=8100, platform=platform)


def test_cpu_command_enables_runtime_multilora():
    argv, env = build("cpu", cpu_kvcache_space_gib=3, cpu_omp_threads_bind="0")
    f = flags(argv)

    assert argv[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert f["--model"] == "/models/m" and f["--port"] == "8100"
    assert f["--enable-lora"] is True
    assert f["--max-loras"] == "6" and f["--max-cpu-loras"] == "12"
    assert f["--max-lora-rank"] == "16"
    assert f["--block-size"] == "32"  # CPU attention needs multiples of 32
    assert f["--no-enable-prefix-caching"] is True
    # PPO needs logprobs of the tempered sampling distribution.
    assert f["--logprobs-mode"] == "processed_logprobs"
    assert "--worker-extension-cls" not in f  # AReaL's wrapper is not used
    assert "--gpu-memory-utilization" not in f
    assert env == {
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
        "VLLM_CPU_KVCACHE_SPACE": "3",
        "VLLM_CPU_OMP_THREADS_BIND": "0",
        "PYTHONPATH": str(VLLM_PLUGIN_DIR),  # our CPU plugin
        "MARLAAS_GROUPED_LORA": "1",
    }
    # The folder holds the module and the entry point vLLM discovers.
    assert (VLLM_PLUGIN_DIR / "marlaas_vllm_plugin.py").is_file()
    entry = next(VLLM_PLUGIN_DIR.glob("*.dist-info")) / "entry_points.txt"
    assert "marlaas_vllm_plugin:register" in entry.read_text()


def test_cpu_command_without_grouped_lora_turns_only_the_lora_ops_off():
    _, env = build("cpu", cpu_grouped_lora=False)

    assert env["MARLAAS_GROUPED_LORA"] == "0"
    assert env["PYTHONPATH"] == str(VLLM_PLUGIN_DIR)  # the seeded-sampling fix


def test_npu_command_uses_vllm_ascend_settings():
    argv, env = build("npu", devices="4,5", env={"HCCL_CONNECT_TIMEOUT": "600"})
    f = flags(argv)

    assert f["--block-size"] == "128"
    assert f["--enable-lora"] is True and f["--max-loras"] == "6"
    assert f["--gpu-memory-utilization"] == "0.9"
    assert env["ASCEND_RT_VISIBLE_DEVICES"] == "4,5"
    assert env["VLLM_ASCEND_ENABLE_NZ"] == "0"
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    assert env["HCCL_CONNECT_TIMEOUT"] == "600"
    assert not any(k.startswith("VLLM_CPU_") for k in env)


def test_cuda_command_keeps_gpu_defaults():
    argv, env = build("cuda", devices="0")
    f = flags(argv)

    assert f["--block-size"] == "16"
    assert env["CUDA_VISIBLE_DEVICES"] == "0"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"platform": "tpu"}, "server.platform must be one of"),
        ({"addresses": ["localhost"]}, "must be host:port"),
        ({"cpu_kvcache_space_gib": 0.5}, "server.cpu_kvcache_space_gib must be a"),
    ],
)
def test_bad_server_config_names_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RolloutServerConfig(**kwargs)


def test_max_cpu_loras_below_max_loras_is_rejected():
    with pytest.raises(ValueError, match="vllm.max_cpu_loras"):
        MultiLoRAvLLMConfig(max_loras=4, max_cpu_loras=2)


def test_server_env_drops_areal_side_variables(monkeypatch):
    from areal_marlaas.rollout.server import clean_environ

    monkeypatch.setenv("PYTHONPATH", "/areal/venv/site-packages")
    monkeypatch.setenv("OMP_NUM_THREADS", "8")
    monkeypatch.setenv("MASTER_PORT", "29500")
    monkeypatch.setenv("HF_HOME", "/cache/hf")

    env = clean_environ()

    assert "PYTHONPATH" not in env and "OMP_NUM_THREADS" not in env
    assert "MASTER_PORT" not in env
    assert env["HF_HOME"] == "/cache/hf"
