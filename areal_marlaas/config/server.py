"""Settings of the shared multi-LoRA vLLM server: how it is launched and served."""

from __future__ import annotations

from dataclasses import dataclass, field

from areal.api.cli_args import InferenceEngineConfig, vLLMConfig

from areal_marlaas.errors import ConfigError
from areal_marlaas.placement import parse_cpus

PLATFORMS = ("auto", "cpu", "cuda", "npu")
LAUNCHES = ("driver", "workers")
# Bind addresses that mean "every interface": never an address to dial.
WILDCARD_HOSTS = ("0.0.0.0", "::", "")


@dataclass
class MultiLoRAvLLMConfig(vLLMConfig):
    """AReaL's vLLM settings plus the multi-LoRA flags AReaL does not expose."""

    dtype: str = field(
        default="float32",
        metadata={
            "help": "Weights/activations/KV dtype of the server. float32 matches the "
            "trainer's default (actor.dtype), so trainer and server logprobs agree, "
            "and CPUs without native bf16 emulate bf16 matmuls slowly; set both to "
            "bfloat16 on GPU/NPU."
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
    scheduling_policy: str = field(
        default="fcfs",
        metadata={
            "help": "vLLM --scheduling-policy. scheduler.rollout_order=fair sets "
            "priority (requests carry their tenant's priority).",
            "choices": ["fcfs", "priority"],
        },
    )

    def __post_init__(self):
        if not self.enable_lora:
            raise ConfigError(
                "vllm.enable_lora must be true: every MARLaaS task is a LoRA adapter."
            )
        if self.scheduling_policy not in ("fcfs", "priority"):
            raise ConfigError(
                "vllm.scheduling_policy must be fcfs or priority, got "
                f"{self.scheduling_policy!r}."
            )
        if self.max_loras < 1:
            raise ConfigError(f"vllm.max_loras must be >= 1, got {self.max_loras}.")
        if self.max_cpu_loras and self.max_cpu_loras < self.max_loras:
            raise ConfigError(
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
    host: str = field(
        default="127.0.0.1",
        metadata={
            "help": "Bind address. 0.0.0.0 = every interface (needed when rollout "
            "workers or the driver are on other nodes)."
        },
    )
    advertise_host: str = field(
        default="",
        metadata={
            "help": "Address the trainer, rollout workers and API dial to reach a "
            "launched server. Empty = server.host, or this node's IP when "
            "server.host is 0.0.0.0."
        },
    )
    launch: str = field(
        default="driver",
        metadata={
            "help": "Who launches the server: driver = one server started by the "
            "marlaas process; workers = each rollout worker (rollout.backend "
            "vllm:dN gives N) starts its own on its node with these settings, "
            "supervised through the worker (needs scheduler.type local|ray|slurm).",
            "choices": list(LAUNCHES),
        },
    )
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
            "weight gather (measured in docs/cpu_serving.md). false = vLLM's own "
            "torch ops. (The plugin loads on CPU either way: it also keeps seeded "
            "sampling working when a prefill is chunked.)"
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
        kv = self.cpu_kvcache_space_gib
        if not (kv >= 1 and float(kv).is_integer()):
            raise ConfigError(
                "server.cpu_kvcache_space_gib must be a whole number of GiB >= 1 "
                f"(vLLM's CPU backend reads it as an integer), got {kv}."
            )
        if self.platform not in PLATFORMS:
            raise ConfigError(
                f"server.platform must be one of {list(PLATFORMS)}, "
                f"got {self.platform!r}."
            )
        if self.launch not in LAUNCHES:
            raise ConfigError(
                f"server.launch must be one of {list(LAUNCHES)}, got {self.launch!r}."
            )
        if self.launch == "workers" and self.addresses:
            raise ConfigError(
                "server.launch=workers starts servers, server.addresses attaches to "
                "running ones: set one of them."
            )
        if self.advertise_host in WILDCARD_HOSTS[:2]:
            raise ConfigError(
                f"server.advertise_host={self.advertise_host!r} is not an address "
                "others can dial; give this node's IP or hostname (or leave it empty)."
            )
        parse_cpus(self.cpu_affinity, "server.cpu_affinity")
        for addr in self.addresses:
            if ":" not in addr:
                raise ConfigError(
                    f"server.addresses entry {addr!r} must be host:port (e.g. "
                    "127.0.0.1:8000)."
                )


@dataclass
class MultiLoRAEngineConfig(InferenceEngineConfig):
    """The rollout engine's config when each rollout worker launches its own
    server (``server.launch=workers``): AReaL's settings plus what the worker
    needs to start it. Built by the rollout session, not a YAML section."""

    server: RolloutServerConfig | None = None
    vllm: MultiLoRAvLLMConfig | None = None
