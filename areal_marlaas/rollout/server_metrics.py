"""Reading the vLLM server's Prometheus ``/metrics`` (KV usage, running adapters)."""

from __future__ import annotations

from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families


@dataclass
class ServerMetrics:
    kv_cache_usage: float = 0.0
    requests_running: float = 0.0
    requests_waiting: float = 0.0
    # Counters since the server started: unlike the gauges, a poll cannot miss them.
    generation_tokens: float = 0.0
    requests_finished: float = 0.0
    kv_cache_size_tokens: int | None = None
    block_size: int | None = None
    num_gpu_blocks: int | None = None
    # Every adapter set the server reported running together in one batch.
    running_adapter_sets: list[frozenset[str]] = field(default_factory=list)


def parse_metrics(text: str) -> ServerMetrics:
    out = ServerMetrics()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "vllm:kv_cache_usage_perc":
                out.kv_cache_usage = s.value
            elif s.name == "vllm:num_requests_running":
                out.requests_running = s.value
            elif s.name == "vllm:num_requests_waiting":
                out.requests_waiting = s.value
            elif s.name == "vllm:generation_tokens_total":
                out.generation_tokens += s.value
            elif s.name == "vllm:request_success_total":  # one sample per reason
                out.requests_finished += s.value
            elif s.name == "vllm:lora_requests_info":
                running = s.labels.get("running_lora_adapters", "")
                names = frozenset(n for n in running.split(",") if n)
                if names:
                    out.running_adapter_sets.append(names)
            elif s.name == "vllm:cache_config_info":
                if s.labels.get("kv_cache_size_tokens", "None") != "None":
                    out.kv_cache_size_tokens = int(s.labels["kv_cache_size_tokens"])
                if s.labels.get("block_size", "None") != "None":
                    out.block_size = int(s.labels["block_size"])
                if s.labels.get("num_gpu_blocks", "None") != "None":
                    out.num_gpu_blocks = int(s.labels["num_gpu_blocks"])
    return out


def capacity_tokens(m: ServerMetrics) -> int | None:
    """Tokens of KV the server can hold, on the scale of ``kv_cache_usage``
    (vLLM's usage divides by its block count less the reserved null block)."""
    if m.num_gpu_blocks and m.block_size:
        return (m.num_gpu_blocks - 1) * m.block_size
    return m.kv_cache_size_tokens


def scrape(address: str, timeout: float = 5.0) -> ServerMetrics:
    resp = httpx.get(f"http://{address}/metrics", timeout=timeout)
    resp.raise_for_status()
    return parse_metrics(resp.text)
