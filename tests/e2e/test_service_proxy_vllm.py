"""The inference proxy on the real multi-LoRA vLLM server: the base model answers,
a checkpoint adapter answers under its own name with its own logprobs, another
tenant cannot use it, and idle adapters are unloaded past the LRU capacity."""

from __future__ import annotations

import shutil

import openai
import pytest
import requests

from areal_marlaas.service.router import VLLMModelRouter
from tests.support.service_api import BASE, create_job, start_service, upload

pytestmark = pytest.mark.vllm

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def svc(tmp_path_factory, vllm_server, model_path):
    service = start_service(
        tmp_path_factory.mktemp("svc"),
        make_router=lambda store: VLLMModelRouter(
            store, vllm_server.address, BASE, str(model_path), capacity=2
        ),
    )
    yield service
    service.api.stop()
    service.store.close()


def served(address: str) -> set[str]:
    data = requests.get(f"http://{address}/v1/models", timeout=30).json()["data"]
    return {m["id"] for m in data if m["id"].startswith("serve-")}


def job_with_checkpoints(svc, client, adapters) -> list:
    """Each adapter copied under the service root as one checkpoint of a job."""
    job = create_job(client, upload(client).id)
    svc.store.set_status(job.id, "queued")
    svc.store.set_status(job.id, "running")
    out = []
    for step, adapter in enumerate(adapters, start=1):
        dest = svc.store.root / "adapters" / job.id / f"v{step}"
        shutil.copytree(adapter, dest)
        out.append(svc.store.record_checkpoint(job.id, step, step, dest))
    return out


def logprobs(client, model: str) -> tuple[list[str], list[float]]:
    r = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=4, temperature=0, logprobs=1
    )
    assert r.model == model
    return r.choices[0].logprobs.tokens, r.choices[0].logprobs.token_logprobs


def test_base_and_checkpoint_answer_and_differ(svc, distinct_adapters):
    _, _, a = svc.tenant("a")
    _, _, b = svc.tenant("b")
    (ckpt,) = job_with_checkpoints(svc, a, distinct_adapters[:1])
    name = ckpt.fine_tuned_model_checkpoint
    chat = a.chat.completions.create(
        model=BASE, messages=[{"role": "user", "content": "Say hello."}], max_tokens=8
    )
    assert chat.model == BASE and chat.choices[0].message.content
    base_tokens, base_lp = logprobs(a, BASE)
    ck_tokens, ck_lp = logprobs(a, name)
    assert (
        base_tokens != ck_tokens
        or max(abs(x - y) for x, y in zip(base_lp, ck_lp, strict=False)) > 1e-3
    ), (base_tokens, base_lp, ck_lp)
    stream = a.chat.completions.create(
        model=name,
        messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=8,
        stream=True,
    )
    chunks = list(stream)
    assert chunks and {c.model for c in chunks} == {name}
    with pytest.raises(openai.NotFoundError):
        b.completions.create(model=name, prompt=PROMPT, max_tokens=2)
    assert f"serve-{ckpt.id}" in served(svc.router.server.split("//")[1])


def test_lru_unloads_past_capacity_on_the_real_server(svc, distinct_adapters):
    _, _, a = svc.tenant("a")
    ckpts = job_with_checkpoints(svc, a, distinct_adapters[1:4])
    address = svc.router.server.split("//")[1]
    for c in ckpts:
        logprobs(a, c.fine_tuned_model_checkpoint)
    names = [f"serve-{c.id}" for c in ckpts]
    assert names[0] not in served(address)
    assert {names[1], names[2]} <= served(address)
    assert svc.router.loaded() == names[1:]
    logprobs(a, ckpts[0].fine_tuned_model_checkpoint)  # loads again on demand
    assert svc.router.loaded() == [names[2], names[0]]
    assert names[1] not in served(address)
