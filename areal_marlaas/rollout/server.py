"""Launch, health-check and stop the shared multi-LoRA vLLM server.

The server runs from its own venv (vLLM's torch/transformers pins differ from
AReaL's), so it is a plain ``vllm.entrypoints.openai.api_server`` process; the
plugin talks to it over HTTP only. AReaL's own server wrapper is not used: it imports
AReaL, and the plugin needs none of its pause/NCCL routes for disk LoRA updates.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests
from areal.api.cli_args import get_py_cmd, vLLMConfig
from areal.utils import logging

from areal_marlaas.paths import vllm_python
from areal_marlaas.placement import parse_cpus, pin_current_process
from areal_marlaas.rollout import reaper

logger = logging.getLogger("MARLaaSServer")

PLATFORMS = ("auto", "cpu", "cuda", "npu")
# AReaL's vLLMConfig fields that only make sense with AReaL's own server wrapper.
_AREAL_ONLY_FIELDS = ("worker_extension_cls",)


@dataclass
class MultiLoRAvLLMConfig(vLLMConfig):
    """AReaL's vLLM settings plus the multi-LoRA flags AReaL does not expose."""

    dtype: str = field(
        default="float32",
        metadata={
            "help": "Weights/activations/KV dtype of the server. float32 matches the "
            "trainer's default (actor.dtype) and is 5x faster than bfloat16 on CPUs "
            "without native bf16 (emulated matmuls); set both to bfloat16 on "
            "GPU/NPU."
        },
    )
    max_cpu_loras: int = field(
        default=0,
        metadata={
            "help": "Adapters kept loaded on the server (vLLM --max-cpu-loras). "
            "0 = 2 x max_loras, so a task's old and new version can both be live."
        },
    )
    enable_lora: bool = field(
        default=True, metadata={"help": "Multi-LoRA serving; MARLaaS needs it on."}
    )
    max_model_len: int | None = field(
        default=2048,
        metadata={"help": "Context length the server reserves per sequence."},
    )
    logprobs_mode: str = field(
        default="processed_logprobs",
        metadata={
            "help": "What vLLM returns as token logprobs. PPO's old logprobs must "
            "be those of the sampling distribution (after temperature); vLLM's "
            "default raw_logprobs ignores temperature.",
            "choices": ["processed_logprobs", "raw_logprobs"],
        },
    )
    max_num_seqs: int = field(
        default=128, metadata={"help": "Sequences the server batches at once."}
    )

    def __post_init__(self):
        if not self.enable_lora:
            raise ValueError(
                "vllm.enable_lora must be true: every MARLaaS task is a LoRA adapter."
            )
        if self.max_loras < 1:
            raise ValueError(f"vllm.max_loras must be >= 1, got {self.max_loras}.")
        if self.max_cpu_loras and self.max_cpu_loras < self.max_loras:
            raise ValueError(
                f"vllm.max_cpu_loras ({self.max_cpu_loras}) must be >= vllm.max_loras "
                f"({self.max_loras}); set it to 0 for the default (2 x max_loras)."
            )


@dataclass
class RolloutServerConfig:
    """Where the rollout server runs and how it is started."""

    addresses: list[str] = field(
        default_factory=list,
        metadata={
            "help": "host:port of running vLLM servers to attach to. "
            "Empty = launch one local server."
        },
    )
    python: str = field(
        default="",
        metadata={
            "help": "Python of the vLLM venv. Empty = $MARLAAS_VLLM_PYTHON or the "
            "venv built by setup."
        },
    )
    host: str = field(default="127.0.0.1", metadata={"help": "Bind address."})
    port: int = field(default=0, metadata={"help": "Port; 0 picks a free one."})
    platform: str = field(
        default="auto",
        metadata={
            "help": "Accelerator of the server: auto|cpu|cuda|npu (npu = vLLM-Ascend).",
            "choices": list(PLATFORMS),
        },
    )
    startup_timeout_s: float = field(
        default=600.0, metadata={"help": "Seconds to wait for /health after launch."}
    )
    cpu_kvcache_space_gib: float = field(
        default=4.0,
        metadata={"help": "CPU only: KV cache size (VLLM_CPU_KVCACHE_SPACE)."},
    )
    cpu_omp_threads_bind: str = field(
        default="auto",
        metadata={
            "help": "CPU only: cores for vLLM's compute (VLLM_CPU_OMP_THREADS_BIND)."
        },
    )
    cpu_affinity: str = field(
        default="",
        metadata={
            "help": "CPU only: cores the whole server process (frontend included) "
            "may run on, e.g. '0' or '0-1'; empty = no pinning. Also binds vLLM's "
            "compute threads there when cpu_omp_threads_bind is auto."
        },
    )
    cpu_grouped_lora: bool = field(
        default=True,
        metadata={
            "help": "CPU only: load areal-marlaas's vLLM plugin, which computes each "
            "adapter's LoRA as one GEMM over its tokens instead of vLLM's per-token "
            "weight gather (LoRA cost of a 1,320-token 3-adapter bf16 prefill on "
            "one core: 14 s -> 4 s). false = vLLM's own torch ops. (The plugin "
            "loads on CPU either way: it also keeps seeded sampling working when "
            "a prefill is chunked.)"
        },
    )
    devices: str = field(
        default="",
        metadata={
            "help": "Accelerator ids for the server (CUDA_VISIBLE_DEVICES or "
            "ASCEND_RT_VISIBLE_DEVICES). Empty = inherit."
        },
    )
    env: dict[str, str] = field(
        default_factory=dict, metadata={"help": "Extra environment for the server."}
    )
    log_file: str = field(
        default="", metadata={"help": "Server log; empty = <run dir>/vllm_server.log."}
    )

    def __post_init__(self):
        if self.platform not in PLATFORMS:
            raise ValueError(
                f"server.platform must be one of {list(PLATFORMS)}, "
                f"got {self.platform!r}."
            )
        parse_cpus(self.cpu_affinity, "server.cpu_affinity")
        for addr in self.addresses:
            if ":" not in addr:
                raise ValueError(
                    f"server.addresses entry {addr!r} must be host:port (e.g. "
                    "127.0.0.1:8000)."
                )


def detect_platform() -> str:
    """The accelerator this machine would give the server."""
    if Path("/dev/davinci0").exists() or os.environ.get("ASCEND_RT_VISIBLE_DEVICES"):
        return "npu"
    if Path("/dev/nvidia0").exists() or shutil.which("nvidia-smi"):
        return "cuda"
    return "cpu"


# KV block sizes the attention backends accept: CPU attention needs multiples of 32,
# vLLM-Ascend works in 128-token blocks (its default).
_BLOCK_MULTIPLE = {"cpu": 32, "npu": 128}


def server_block_size(block_size: int, platform: str) -> int:
    """The configured block size rounded up to what the platform's backend takes."""
    multiple = _BLOCK_MULTIPLE.get(platform, 1)
    return -(-block_size // multiple) * multiple


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def resolve_platform(server: RolloutServerConfig) -> str:
    return detect_platform() if server.platform == "auto" else server.platform


def server_argv(args: dict, server: RolloutServerConfig, platform: str) -> list[str]:
    """vLLM's own OpenAI server (from the vLLM venv) for AReaL-style ``args``."""
    args = dict(args)
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


def is_healthy(address: str, timeout: float = 5.0) -> bool:
    try:
        return requests.get(f"http://{address}/health", timeout=timeout).ok
    except requests.RequestException:
        return False


class VLLMServer:
    """One local vLLM server process: ``start()`` blocks until healthy."""

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
        self.port = server.port or free_port(server.host)
        self.address = f"{server.host}:{self.port}"
        self.process: subprocess.Popen | None = None
        self.startup_s: float | None = None

    def command(self) -> tuple[list[str], dict[str, str]]:
        return build_server_command(self.model, self.vllm_cfg, self.server, self.port)

    def start(self) -> str:
        argv, env = self.command()
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        logger.info(f"Starting vLLM server on {self.address} (log: {self.log_file})")
        t0 = time.monotonic()
        cpus = parse_cpus(self.server.cpu_affinity, "server.cpu_affinity")
        with open(self.log_file, "ab") as log:
            self.process = subprocess.Popen(
                with_reaper(argv),
                env={**clean_environ(), **env},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # so stop() can kill its worker processes too
                # Children (vLLM's engine core) inherit the affinity.
                preexec_fn=(lambda: pin_current_process(cpus)) if cpus else None,
            )
        deadline = t0 + self.server.startup_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"vLLM server exited with code {self.process.returncode} during "
                    f"startup; see {self.log_file}:\n{self.log_tail()}"
                )
            if is_healthy(self.address, timeout=2):
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
        try:
            return "\n".join(
                self.log_file.read_text(errors="replace").splitlines()[-lines:]
            )
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout: float = 30.0) -> None:
        if self.process is None:
            return
        # The server was started as a session leader: its pid is the group id, and
        # killing the group also reaps the engine-core workers it forked.
        pgid = self.process.pid
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            # A hung (stopped) server only acts on SIGTERM once continued.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGCONT)
            try:
                self.process.wait(timeout)
                break
            except subprocess.TimeoutExpired:
                continue
        self.process = None
        logger.info(f"vLLM server on {self.address} stopped")

    def __enter__(self) -> VLLMServer:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
