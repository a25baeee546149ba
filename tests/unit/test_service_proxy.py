"""The inference proxy and VLLMModelRouter against a small stand-in for vLLM's
OpenAI server (its LoRA load/unload routes, completions, SSE streams), so the
routing, renaming, streaming and LRU rules run in the default suite. The real
server is in test_service_proxy_vllm.py."""

from __future__ import annotations

import json
import threading
import time

import anyio
import httpx
import openai
import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from areal_marlaas.service.router import VLLMModelRouter
from tests.support.service_api import BASE, create_job, start_service, upload

BASE_PATH = "/models/SmolLM2-135M-Instruct"


class FakeVLLM:
    """Records LoRA loads/unloads; answers with the upstream model name it got."""

    def __init__(self):
        self.loaded: dict[str, str] = {}
        self.log: list[tuple[str, str]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.app = self._app()

    def _app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/v1/load_lora_adapter")
        async def load(req: Request):
            body = await req.json()
            if body["lora_name"] in self.loaded:
                msg = f"The lora adapter '{body['lora_name']}' has already been loaded."
                return JSONResponse({"error": {"message": msg}}, status_code=400)
            self.loaded[body["lora_name"]] = body["lora_path"]
            self.log.append(("load", body["lora_name"]))
            return "Success"

        @app.post("/v1/unload_lora_adapter")
        async def unload(req: Request):
            name = (await req.json())["lora_name"]
            if self.loaded.pop(name, None) is None:
                return JSONResponse(
                    {"error": {"message": "not found"}}, status_code=404
                )
            self.log.append(("unload", name))
            return "Success"

        @app.post("/v1/chat/completions")
        @app.post("/v1/completions")
        async def generate(req: Request):
            body = await req.json()
            model = body["model"]
            if model != BASE_PATH and model not in self.loaded:
                return JSONResponse(
                    {
                        "error": {
                            "message": f"The model `{model}` does not exist.",
                            "type": "NotFoundError",
                            "param": "model",
                            "code": 404,
                        }
                    },
                    status_code=404,
                )
            if body.get("max_tokens", 1) < 0:
                return JSONResponse(
                    {
                        "object": "error",
                        "message": f"bad max_tokens for {model}",
                        "type": "BadRequestError",
                        "code": 400,
                    },
                    status_code=400,
                )
            text = f"served by {model}"
            chat = req.url.path.endswith("chat/completions")
            if not body.get("stream"):
                choice = (
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text},
                        "finish_reason": "stop",
                    }
                    if chat
                    else {"index": 0, "text": text, "finish_reason": "stop"}
                )
                return {
                    "id": "cmpl-1",
                    "object": "chat.completion" if chat else "text_completion",
                    "created": 1,
                    "model": model,
                    "choices": [choice],
                    "usage": {
                        "prompt_tokens": 1,
                        "completion_tokens": 3,
                        "total_tokens": 4,
                    },
                }

            async def events():
                for i, word in enumerate(text.split(" ")):
                    chunk = {
                        "id": "c",
                        "object": "chat.completion.chunk",
                        "created": 1,
                        "model": model,
                        "choices": [
                            {
                                "index": 0,
                                "delta": {"content": word + " "},
                                "finish_reason": None,
                            }
                        ],
                    }
                    yield f"data: {json.dumps(chunk)}\n\n"
                    if i == 0:
                        await anyio.to_thread.run_sync(self.gate.wait)
                yield "data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream")

        return app


@pytest.fixture(scope="module")
def fake_vllm():
    fake = FakeVLLM()
    server = uvicorn.Server(
        uvicorn.Config(fake.app, host="127.0.0.1", port=0, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    fake.address = f"127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    yield fake
    server.should_exit = True
    thread.join(10)


@pytest.fixture
def svc(tmp_path, fake_vllm):
    fake_vllm.loaded.clear()
    fake_vllm.log.clear()
    service = start_service(
        tmp_path,
        make_router=lambda store: VLLMModelRouter(
            store, fake_vllm.address, BASE, BASE_PATH, capacity=2
        ),
    )
    yield service
    service.api.stop()
    service.store.close()


def checkpoints(svc, client, n: int) -> tuple[str, list]:
    """A job of the client's tenant with ``n`` checkpoints (empty PEFT folders)."""
    job = create_job(client, upload(client).id)
    svc.store.set_status(job.id, "queued")
    svc.store.set_status(job.id, "running")
    out = []
    for step in range(1, n + 1):
        path = svc.store.root / "adapters" / job.id / f"v{step}"
        path.mkdir(parents=True)
        (path / "adapter_config.json").write_text("{}")
        out.append(svc.store.record_checkpoint(job.id, step, step, path))
    return client.fine_tuning.jobs.retrieve(job.id).fine_tuned_model, out


def test_base_model_chat_and_completion_are_proxied_with_the_public_name(svc):
    _, _, client = svc.tenant()
    reply = client.chat.completions.create(
        model=BASE, messages=[{"role": "user", "content": "hi"}]
    )
    assert reply.model == BASE
    assert reply.choices[0].message.content == f"served by {BASE_PATH}"
    done = client.completions.create(model=BASE, prompt="hi", max_tokens=3)
    assert done.model == BASE and done.choices[0].text == f"served by {BASE_PATH}"


def test_checkpoints_load_on_demand_under_serve_names(svc, fake_vllm):
    _, _, client = svc.tenant()
    ft, (c1, c2) = checkpoints(svc, client, 2)
    r = client.chat.completions.create(
        model=c1.fine_tuned_model_checkpoint,
        messages=[{"role": "user", "content": "x"}],
    )
    assert r.model == c1.fine_tuned_model_checkpoint
    assert r.choices[0].message.content == f"served by serve-{c1.id}"
    assert fake_vllm.loaded[f"serve-{c1.id}"] == str(svc.store.root / c1.adapter_path)
    # The job's fine_tuned_model is its newest checkpoint.
    r = client.chat.completions.create(
        model=ft, messages=[{"role": "user", "content": "x"}]
    )
    assert r.model == ft and r.choices[0].message.content == f"served by serve-{c2.id}"
    assert all(not n.startswith(("job_", "ftjob")) for n in fake_vllm.loaded)


def test_streams_are_passed_through_with_the_tenant_model_name(svc):
    _, _, client = svc.tenant()
    ft, (c1,) = checkpoints(svc, client, 1)
    stream = client.chat.completions.create(
        model=ft, messages=[{"role": "user", "content": "x"}], stream=True
    )
    chunks = list(stream)
    assert {c.model for c in chunks} == {ft}
    text = "".join(c.choices[0].delta.content for c in chunks)
    assert text.strip() == f"served by serve-{c1.id}"


def test_other_tenants_and_unknown_models_are_404(svc, fake_vllm):
    _, _, a = svc.tenant("a")
    _, _, b = svc.tenant("b")
    ft, (c1,) = checkpoints(svc, a, 1)
    for model in (
        ft,
        c1.fine_tuned_model_checkpoint,
        "nope",
        f"serve-{c1.id}",
        BASE_PATH,
    ):
        with pytest.raises(
            openai.NotFoundError, match="does not exist or you do not have access"
        ):
            b.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "x"}]
            )
    assert fake_vllm.log == []  # nothing was loaded for B


def test_upstream_errors_keep_the_envelope_and_hide_upstream_names(svc):
    _, _, client = svc.tenant()
    ft, (c1,) = checkpoints(svc, client, 1)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=ft, prompt="x", max_tokens=-1)
    assert e.value.message.endswith(f"bad max_tokens for {ft}")
    assert "serve-" not in json.dumps(e.value.body)


def test_lru_unloads_idle_adapters_past_capacity_never_one_in_flight(svc, fake_vllm):
    _, _, client = svc.tenant()
    _, (c1, c2, c3) = checkpoints(svc, client, 3)
    names = [f"serve-{c.id}" for c in (c1, c2, c3)]

    def ask(c):
        client.chat.completions.create(
            model=c.fine_tuned_model_checkpoint,
            messages=[{"role": "user", "content": "x"}],
        )

    # c1's stream stays open (the fake server holds it) while c2 and c3 load.
    fake_vllm.gate.clear()
    stream = client.chat.completions.create(
        model=c1.fine_tuned_model_checkpoint,
        messages=[{"role": "user", "content": "x"}],
        stream=True,
    )
    first = next(iter(stream))
    assert first.model == c1.fine_tuned_model_checkpoint
    ask(c2)
    ask(c3)  # over capacity 2: c2 is idle and least recent -> unloaded; c1 is busy
    assert set(fake_vllm.loaded) == {names[0], names[2]}
    assert ("unload", names[1]) in fake_vllm.log and (
        "unload",
        names[0],
    ) not in fake_vllm.log
    fake_vllm.gate.set()
    list(stream)
    ask(c2)  # reloaded on demand; now c1 (idle, oldest) goes
    deadline = time.monotonic() + 5
    while names[0] in fake_vllm.loaded and time.monotonic() < deadline:
        time.sleep(0.05)
    assert set(fake_vllm.loaded) == {names[1], names[2]}
    assert svc.router.loaded() == [names[2], names[1]]
    assert [e for e in fake_vllm.log if e[1] == names[1]] == [
        ("load", names[1]),
        ("unload", names[1]),
        ("load", names[1]),
    ]


def test_unreachable_upstream_is_502(svc, tmp_path):
    _, key, client = svc.tenant()
    svc.router.base_url = "http://127.0.0.1:9/v1"  # nothing listens on port 9
    r = httpx.post(
        f"{svc.api.base_url}/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={"model": BASE, "messages": [{"role": "user", "content": "x"}]},
    )
    assert r.status_code == 502 and r.json()["error"]["type"] == "server_error"


def test_adapters_are_loaded_again_after_a_server_restart(svc, fake_vllm):
    _, _, client = svc.tenant()
    ft, (c1,) = checkpoints(svc, client, 1)

    def ask():
        r = client.chat.completions.create(
            model=ft, messages=[{"role": "user", "content": "x"}]
        )
        return r.choices[0].message.content

    assert ask() == f"served by serve-{c1.id}"
    fake_vllm.loaded.clear()  # the supervisor restarted the server
    assert ask() == f"served by serve-{c1.id}"
    assert [e for e in fake_vllm.log if e[0] == "load"] == [
        ("load", f"serve-{c1.id}")
    ] * 2
    assert svc.router.loaded() == [f"serve-{c1.id}"]
