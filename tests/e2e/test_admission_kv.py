"""The admission estimate against the real server's own KV accounting."""

from __future__ import annotations

import json

import pytest
import requests

from areal_marlaas.admission import KVModel, task_kv_bytes
from areal_marlaas.rollout.server_metrics import capacity_tokens, parse_metrics, scrape

pytestmark = pytest.mark.vllm


def test_estimate_matches_server_reported_kv_for_one_running_batch(
    vllm_server, model_path
):
    base = f"http://{vllm_server.address}"
    info = scrape(vllm_server.address)
    kv = KVModel.from_model_dir(model_path, vllm_server.vllm_cfg.dtype, info.block_size)
    capacity = capacity_tokens(info) * kv.bytes_per_token
    # Shape the batch so each sequence holds its final block count from prefill on:
    # 9 blocks + 1 token of prompt, then block_size - 1 new tokens = exactly 10
    # blocks. Usage then sits at its peak from every sequence's first token to
    # its last. Every sequence has its own prompt: samples of one prompt that the
    # server happens to schedule in different steps share its prefix-cached
    # blocks, so their usage depends on timing (the estimate is then an upper
    # bound, not exact).
    bs = info.block_size
    prompt_len, new_tokens, prompts, samples = 9 * bs + 1, bs - 1, 8, 1
    prompt_ids = [
        [1000 + 37 * p + i for i in range(prompt_len)] for p in range(prompts)
    ]
    estimate = task_kv_bytes(kv, prompt_len, new_tokens, prompts, samples)

    # The server's usage is read once, at a moment the stream shows is inside
    # that plateau: every sequence has streamed 2 tokens (its prefill is done and
    # the step that finished it is recorded), none has finished; the same
    # scrape's running count confirms all 8 were still running.
    tokens = [0] * prompts
    finished: set[int] = set()
    seen = None
    with requests.post(
        f"{base}/v1/completions",
        json={
            "model": str(model_path),
            "prompt": prompt_ids,
            "n": samples,
            "max_tokens": new_tokens,
            "ignore_eos": True,  # every sequence reaches its full length
            "temperature": 1.0,
            "stream": True,
        },
        stream=True,
        timeout=300,
    ) as out:
        assert out.status_code == 200, out.text
        for line in out.iter_lines():
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            for choice in json.loads(line[6:])["choices"]:
                tokens[choice["index"]] += 1
                if choice.get("finish_reason"):
                    assert choice["finish_reason"] == "length", choice
                    finished.add(choice["index"])
            if seen is None and min(tokens) >= 2:
                seen = scrape(vllm_server.address), sorted(finished)
    assert seen is not None and len(finished) == prompts, (tokens, finished)
    metrics, finished_when_read = seen
    assert finished_when_read == [], "read after a sequence had finished"
    assert metrics.requests_running == prompts, "read outside the plateau"

    reported = metrics.kv_cache_usage * capacity
    ratio = reported / estimate
    print(f"estimate {estimate} B, server {reported:.0f} B, ratio {ratio:.4f}")
    # Block-exact: the estimate is the server's own count (float rounding aside).
    assert 0.99 <= ratio <= 1.01


def test_parse_metrics_reads_usage_and_capacity():
    text = (
        "# HELP vllm:kv_cache_usage_perc x\n# TYPE vllm:kv_cache_usage_perc gauge\n"
        'vllm:kv_cache_usage_perc{engine="0"} 0.25\n'
        "# HELP vllm:cache_config_info x\n# TYPE vllm:cache_config_info gauge\n"
        'vllm:cache_config_info{block_size="32",num_gpu_blocks="101",engine="0"} 1\n'
    )

    m = parse_metrics(text)

    assert m.kv_cache_usage == 0.25
    assert capacity_tokens(m) == 100 * 32


def test_parse_metrics_sums_finished_requests_over_their_reasons():
    text = (
        "# HELP vllm:request_success x\n# TYPE vllm:request_success counter\n"
        'vllm:request_success_total{engine="0",finished_reason="stop"} 3.0\n'
        'vllm:request_success_total{engine="0",finished_reason="length"} 5.0\n'
        "# HELP vllm:generation_tokens x\n# TYPE vllm:generation_tokens counter\n"
        'vllm:generation_tokens_total{engine="0"} 256.0\n'
    )

    m = parse_metrics(text)

    assert (m.requests_finished, m.generation_tokens) == (8.0, 256.0)
