"""Launch, health-check and stop the shared multi-LoRA vLLM server.

The server runs from its own venv (vLLM's torch/transformers pins differ from
AReaL's), so it is a plain ``vllm.entrypoints.openai.api_server`` process; the
plugin talks to it over HTTP only. AReaL's own server wrapper is not used: it imports
AReaL, and the plugin needs none of its pause/NCCL routes for disk LoRA updates.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import time
from pathlib import Path
from typing import IO

import httpx
from areal.api.cli_args import get_py_cmd, vLLMConfig
from areal.utils import logging
from areal.utils.network import gethostip

from areal_marlaas.config.server import (
    WILDCARD_HOSTS,
    MultiLoRAvLLMConfig,
    RolloutServerConfig,
)
from areal_marlaas.paths import vllm_python
from areal_marlaas.placement import parse_cpus, pin_current_process
from areal_marlaas.procs import stop_group, tail
from areal_marlaas.rollout import reaper
from areal_marlaas.rollout.platform import resolve_platform, server_block_size

logger = logging.getLogger("MARLaaSServer")

# AReaL's vLLMConfig fields that only make sense with AReaL's own server wrapper.
_AREAL_ONLY_FIELDS = ("worker_extension_cls",)


def advertised_host(server: RolloutServerConfig) -> str:
    """The host others dial for a server launched on this node: bind and
    advertised addresses differ when the server binds every interface."""
    if server.advertise_host:
        return server.advertise_host
    return gethostip() if server.host in WILDCARD_HOSTS else server.host


def is_loopback(host: str) -> bool:
    return host == "localhost" or host.startswith("127.") or host == "::1"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def server_argv(args: dict, server: RolloutServerConfig, platform: str) -> list[str]:
    """vLLM's own OpenAI server (from the vLLM venv) for AReaL-style ``args``."""
    args = {**args, "logprobs_mode": args.get("logprobs_mode") or "processed_logprobs"}
    for name in _AREAL_ONLY_FIELDS:
        args.pop(name, None)
    args["block_size"] = server_block_size(args.get("block_size") or 16, platform)
    if platform == "cpu":
        # CPU attention has no GPU memory to profile; the KV size comes from env.
        args.pop("gpu_memory_utilization", None)
    argv = get_py_cmd("vllm.entrypoints.openai.api_server", args)
    argv[0] = server.python or vllm_python()
    return argv


def clean_environ() -> dict[str, str]:
    """This process's environment without what belongs to the AReaL side: the
    server runs from its own venv (AReaL's workers export PYTHONPATH) and sets up
    its own threads and process group (workers export OMP_NUM_THREADS, RANK, ...)."""
    drop = {
        "PYTHONPATH",
        "VIRTUAL_ENV",
        "PYTHONHOME",
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "MASTER_ADDR",
        "MASTER_PORT",
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
    }
    return {k: v for k, v in os.environ.items() if k not in drop}


# areal-marlaas's vLLM general plugin; runs in the vLLM venv (see its docstring).
VLLM_PLUGIN_DIR = Path(__file__).resolve().parent / "vllm_site"


def server_env(server: RolloutServerConfig, platform: str) -> dict[str, str]:
    # Runtime LoRA load/unload routes exist only with this flag.
    env = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
    if platform == "cpu":
        env["VLLM_CPU_KVCACHE_SPACE"] = f"{server.cpu_kvcache_space_gib:g}"
        bind = server.cpu_omp_threads_bind
        if bind == "auto" and server.cpu_affinity:
            bind = server.cpu_affinity
        env["VLLM_CPU_OMP_THREADS_BIND"] = bind
        # The plugin's folder: its .dist-info registers the vLLM entry point.
        env["PYTHONPATH"] = str(VLLM_PLUGIN_DIR)
        env["MARLAAS_GROUPED_LORA"] = "1" if server.cpu_grouped_lora else "0"
    elif platform == "npu":
        if server.devices:
            env["ASCEND_RT_VISIBLE_DEVICES"] = server.devices
        # Keep weights in ND layout so adapters can be swapped at run time.
        env["VLLM_ASCEND_ENABLE_NZ"] = "0"
    elif platform == "cuda" and server.devices:
        env["CUDA_VISIBLE_DEVICES"] = server.devices
    env.update(server.env)
    return env


def build_server_command(
    model: str,
    vllm_cfg: MultiLoRAvLLMConfig,
    server: RolloutServerConfig,
    port: int,
    platform: str | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The argv and extra environment that start one multi-LoRA server."""
    platform = platform or resolve_platform(server)
    cfg = dataclasses.replace(vllm_cfg, model=model)
    if not cfg.max_cpu_loras:
        cfg.max_cpu_loras = 2 * cfg.max_loras
    args = vLLMConfig.build_args(cfg, tp_size=1, pp_size=1, host=server.host, port=port)
    return server_argv(args, server, platform), server_env(server, platform)


def with_reaper(argv: list[str]) -> list[str]:
    """Run ``argv`` under the reaper (with the same python), so the server and its
    engine-core workers die with the process that launched them, even on SIGKILL."""
    return [argv[0], str(Path(reaper.__file__).resolve()), *argv]


def spawn(
    argv: list[str],
    env: dict[str, str],
    server: RolloutServerConfig,
    log: IO | None = None,
) -> subprocess.Popen:
    """Start a server command the one way every launcher uses: under the reaper,
    as its own process session (so stopping it stops its engine-core workers),
    pinned to ``server.cpu_affinity``, with the AReaL side's environment removed."""
    cpus = parse_cpus(server.cpu_affinity, "server.cpu_affinity")
    return subprocess.Popen(
        with_reaper(argv),
        env={**clean_environ(), **env},
        stdout=log,
        stderr=subprocess.STDOUT if log is not None else None,
        start_new_session=True,
        # Children (vLLM's engine core) inherit the affinity.
        preexec_fn=(lambda: pin_current_process(cpus)) if cpus else None,
    )


def is_healthy(address: str, timeout: float = 5.0) -> bool:
    try:
        return httpx.get(f"http://{address}/health", timeout=timeout).is_success
    except httpx.HTTPError:
        return False


class VLLMServer:
    """One local vLLM server process: ``start()`` blocks until healthy and
    returns ``address``, the advertised host:port others dial; ``local_address``
    is how this node reaches it."""

    def __init__(
        self,
        model: str,
        vllm_cfg: MultiLoRAvLLMConfig,
        server: RolloutServerConfig,
        log_file: str | Path,
    ):
        self.model = model
        self.vllm_cfg = vllm_cfg
        self.server = server
        self.log_file = Path(log_file)
        self.port = server.port or free_port(server.host or "0.0.0.0")
        self.address = f"{advertised_host(server)}:{self.port}"
        local = "127.0.0.1" if server.host in WILDCARD_HOSTS else server.host
        self.local_address = f"{local}:{self.port}"
        self.process: subprocess.Popen | None = None
        self.startup_s: float | None = None

    def command(self) -> tuple[list[str], dict[str, str]]:
        return build_server_command(self.model, self.vllm_cfg, self.server, self.port)

    def start(self) -> str:
        argv, env = self.command()
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        logger.info(f"Starting vLLM server on {self.address} (log: {self.log_file})")
        t0 = time.monotonic()
        with open(self.log_file, "ab") as log:
            self.process = spawn(argv, env, self.server, log)
        deadline = t0 + self.server.startup_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"vLLM server exited with code {self.process.returncode} during "
                    f"startup; see {self.log_file}:\n{self.log_tail()}"
                )
            if is_healthy(self.local_address, timeout=2):
                self.startup_s = time.monotonic() - t0
                logger.info(
                    f"vLLM server ready on {self.address} in {self.startup_s:.1f}s"
                )
                return self.address
            time.sleep(1)
        self.stop()
        raise TimeoutError(
            f"vLLM server not healthy after {self.server.startup_timeout_s}s "
            f"(server.startup_timeout_s); see {self.log_file}:\n{self.log_tail()}"
        )

    def log_tail(self, lines: int = 30) -> str:
        return tail(self.log_file, lines)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def exited(self) -> str | None:
        """None while the process runs, else how it ended (the supervisor's
        check, the same for a server launched on a rollout worker)."""
        if self.alive():
            return None
        return f"code {None if self.process is None else self.process.returncode}"

    def healthy(self, timeout: float) -> bool:
        return is_healthy(self.local_address, timeout=timeout)

    def stop(self, timeout: float = 30.0) -> None:
        if self.process is None:
            return
        stop_group(self.process, timeout)
        self.process = None
        logger.info(f"vLLM server on {self.address} stopped")

    def __enter__(self) -> VLLMServer:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
