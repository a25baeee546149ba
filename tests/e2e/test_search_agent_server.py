"""The search agent's parts against the real vLLM server: the LLM judge on
both routes, and generation ending at a tool's stop string."""

from __future__ import annotations

import asyncio

import pytest
import requests
from areal.api.cli_args import GenerationHyperparameters
from areal.api.io_struct import ModelRequest

from areal_marlaas.tasks.answer_judge import JudgeClient

pytestmark = pytest.mark.vllm


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
def test_judge_against_real_vllm_returns_zero_or_one(vllm_server, model_path, route):
    base = f"http://{vllm_server.address}"
    models = requests.get(f"{base}/v1/models", timeout=10).json()["data"]
    model = next(m["id"] for m in models if m["id"] == str(model_path))
    judge = JudgeClient(base + route, model, timeout_s=60, retries=1)

    result = asyncio.run(
        judge.score("What is the capital of France?", "Paris", "Paris")
    )

    assert result.score in (0.0, 1.0)
    assert result.reply or result.reason
    assert result.attempts == 1  # the server answered; no retry was needed


def test_real_server_stops_at_stop_string_and_returns_its_tokens(
    engine,  # noqa: F811
    distinct_adapters,
    tokenizer,
):
    engine.register_task("stoptest", 0, distinct_adapters[0])
    prompt = "".join(f"<search>query {i}</search>\n" for i in range(12))
    gconfig = GenerationHyperparameters(
        max_new_tokens=32, greedy=True, lora_name="stoptest", stop=["</search>"]
    )
    req = ModelRequest(input_ids=tokenizer.encode(prompt + "<search>"), gconfig=gconfig)

    resp = asyncio.run(engine.agenerate(req))

    text = tokenizer.decode(resp.output_tokens)
    # Generation ended at the stop string, and the tokens that spell it came back.
    assert resp.stop_reason == "stop", text
    assert text.count("</search>") == 1 and text.rstrip().endswith("</search>")
    assert len(resp.output_logprobs) == len(resp.output_tokens)
