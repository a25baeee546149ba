"""The admission estimate against the real server's own KV accounting."""

from __future__ import annotations

import threading
import time

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
    # blocks. Usage then sits at its peak through every decode step, so a poll
    # can't miss it however slowly the machine runs (a short prompt peaks only in
    # the last few steps, which a loaded CI machine's poller missed). Every
    # sequence has its own prompt: samples of one prompt that the server happens
    # to schedule in different steps share its prefix-cached blocks, so their
    # usage depends on timing (the estimate is then an upper bound, not exact).
    bs = info.block_size
    prompt_len, new_tokens, prompts, samples = 9 * bs + 1, bs - 1, 8, 1
    prompt_ids = [
        [1000 + 37 * p + i for i in range(prompt_len)] for p in range(prompts)
    ]
    estimate = task_kv_bytes(kv, prompt_len, new_tokens, prompts, samples)

    peak = 0.0
    done = threading.Event()

    def poll():
        nonlocal peak
        while not done.is_set():
            peak = max(peak, scrape(vllm_server.address).kv_cache_usage)
            time.sleep(0.02)

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        out = requests.post(
            f"{base}/v1/completions",
            json={
                "model": str(model_path),
                "prompt": prompt_ids,
                "n": samples,
                "max_tokens": new_tokens,
                "ignore_eos": True,  # every sequence reaches its full length
                "temperature": 1.0,
            },
            timeout=300,
        )
    finally:
        done.set()
        poller.join()
    assert out.status_code == 200, out.text
    assert all(c["finish_reason"] == "length" for c in out.json()["choices"])

    reported = peak * capacity
    ratio = reported / estimate
    print(f"estimate {estimate} B, server peak {reported:.0f} B, ratio {ratio:.4f}")
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
