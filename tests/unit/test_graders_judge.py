"""score_model and cosine graders against a real local HTTP server.

The server (``http.server`` on 127.0.0.1) returns canned OpenAI-style chat
completions and embeddings. It stands in for a judge model because a real model
cannot be made to return a malformed reply, a refusal, an HTTP 500 or a hang on
demand, and those are what these tests are about; the requests it receives are
checked as a real endpoint would read them.
"""

from __future__ import annotations

import json
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from openai.types.fine_tuning.alpha import GraderRunResponse

from areal_marlaas.graders import (
    GradingContext,
    grade_batch_sync,
    run_grader_sync,
    validate_grader,
)


class FakeOpenAI(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), Handler)
        self.requests: list[tuple[str, dict, dict]] = []
        self.replies: list[tuple[int, object, float]] = []  # status, body, delay
        self.embeddings: dict[str, list[float]] = {}

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"

    def reply(self, content=None, status=200, delay=0.0, refusal=None, body=None):
        if body is None:
            body = {
                "id": "c1",
                "object": "chat.completion",
                "model": "judge-model-2025",
                "choices": [
                    {
                        "index": 0,
                        "message": {
                            "role": "assistant",
                            "content": content,
                            "refusal": refusal,
                        },
                        "finish_reason": "stop",
                    }
                ],
                "usage": {
                    "prompt_tokens": 20,
                    "completion_tokens": 2,
                    "total_tokens": 22,
                },
            }
        self.replies.append((status, body, delay))


class Handler(BaseHTTPRequestHandler):
    server: FakeOpenAI

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append((self.path, dict(self.headers), body))
        if self.path.endswith("/embeddings"):
            status, out, delay = 200, None, 0.0
            if self.server.replies:
                status, out, delay = self.server.replies.pop(0)
            if out is None:
                out = {
                    "object": "list",
                    "data": [
                        {"index": i, "embedding": self.server.embeddings[t]}
                        for i, t in enumerate(body["input"])
                    ],
                }
        else:
            # The last canned reply repeats.
            status, out, delay = (
                self.server.replies.pop(0)
                if len(self.server.replies) > 1
                else self.server.replies[0]
            )
        time.sleep(delay)
        data = out.encode() if isinstance(out, str) else json.dumps(out).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (timeout test)


@pytest.fixture
def server():
    srv = FakeOpenAI()
    t = threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def ctx_for(server, **over) -> GradingContext:
    return GradingContext(
        judge_base_url=server.base_url,
        judge_api_key="sk-judge",
        judge_models=("judge-model",),
        judge_timeout_s=over.pop("judge_timeout_s", 5.0),
        **over,
    )


SPEC = {
    "type": "score_model",
    "name": "judge",
    "model": "judge-model",
    "input": [
        {"role": "developer", "content": "Score 0-10. Reply with the number only."},
        {"role": "user", "content": "Q: {{ item.q }}\nA: {{ sample.output_text }}"},
    ],
    "range": [0, 10],
    "sampling_params": {
        "temperature": 0,
        "max_completions_tokens": 8,
        "seed": 3,
        "top_p": 0.9,
    },
}


def judge(server, output="Paris", item=None, spec=SPEC, **ctx):
    g = validate_grader(spec, ctx_for(server, **ctx))
    return run_grader_sync(
        g, output, item or {"q": "Capital of France?"}, ctx_for(server, **ctx)
    )


def test_bare_number_reply_and_the_request_sent(server):
    server.reply("7")
    res = judge(server)
    assert res.reward == 7.0 and res.reason == ""
    path, headers, body = server.requests[0]
    assert path == "/v1/chat/completions"
    assert headers["Authorization"] == "Bearer sk-judge"
    assert body["model"] == "judge-model"
    assert body["messages"] == [
        {"role": "system", "content": "Score 0-10. Reply with the number only."},
        {"role": "user", "content": "Q: Capital of France?\nA: Paris"},
    ]
    assert body["temperature"] == 0 and body["seed"] == 3 and body["top_p"] == 0.9
    assert body["max_completion_tokens"] == 8
    meta = res.metadata
    assert (
        meta["token_usage"] == 22 and meta["sampled_model_name"] == "judge-model-2025"
    )
    assert res.token_usage_per_model["judge-model-2025"]["total_tokens"] == 22
    parsed = GraderRunResponse.model_validate(res.to_dict())
    assert parsed.metadata.token_usage == 22 and parsed.reward == 7.0


@pytest.mark.parametrize(
    "reply, want",
    [
        ('{"score": 4.5}', 4.5),
        ('```json\n{"result": 3, "steps": []}\n```', 3.0),
        (" 10 \n", 10.0),
        ("0", 0.0),
        ("2.5e0", 2.5),
    ],
)
def test_accepted_reply_formats(server, reply, want):
    server.reply(reply)
    res = judge(server)
    assert res.reward == want and res.reason == ""


@pytest.mark.parametrize(
    "reply, why",
    [
        ("I think it deserves a 7", "neither a number nor"),
        ('{"grade": 7}', "neither a number nor"),
        ("11", "outside range [0, 10]"),
        ("-1", "outside range"),
        ("NaN", "not a finite number"),
        ("", "neither a number nor"),
        (None, "neither a number nor"),
    ],
)
def test_unparseable_or_out_of_range_reply_scores_zero(server, reply, why):
    server.reply(reply)
    res = judge(server)
    assert res.reward == 0.0
    assert res.errors["model_grader_parse_error"] is True
    assert why in res.reason


def test_refusal(server):
    server.reply(None, refusal="I cannot grade this.")
    res = judge(server)
    assert res.reward == 0.0 and res.errors["model_grader_refusal_error"] is True
    assert "I cannot grade this." in res.reason


def test_http_500_is_retried_then_scores_zero(server):
    server.reply(status=500, body={"error": {"message": "overloaded"}})
    res = judge(server, judge_retries=1)
    assert len(server.requests) == 2
    assert res.reward == 0.0 and res.errors["model_grader_server_error"] is True
    details = res.errors["model_grader_server_error_details"]
    assert "HTTP 500" in details and "overloaded" in details
    assert GraderRunResponse.model_validate(
        res.to_dict()
    ).metadata.errors.api_model_grader_server_error


def test_http_400_is_not_retried(server):
    server.reply(status=400, body={"error": {"message": "bad model"}})
    res = judge(server, judge_retries=3)
    assert len(server.requests) == 1 and "HTTP 400" in res.reason


def test_a_retry_can_succeed(server):
    server.reply(status=503, body="busy")
    server.reply("6")
    assert judge(server, judge_retries=1).reward == 6.0


def test_timeout_scores_zero(server):
    server.reply("5", delay=30.0)
    start = time.monotonic()
    res = judge(server, judge_timeout_s=0.3, judge_retries=0)
    # Cut at the 0.3 s timeout (~0.3 s here), not after the reply's 30 s.
    assert time.monotonic() - start < 10
    assert res.reward == 0.0 and "Timeout" in res.reason


def test_connection_refused_scores_zero():
    ctx = GradingContext(
        judge_base_url="http://127.0.0.1:9/v1", judge_models=("*",), judge_retries=0
    )
    res = run_grader_sync(validate_grader(SPEC, ctx), "x", {"q": "q"}, ctx)
    assert res.reward == 0.0 and res.errors["model_grader_server_error"] is True


def test_not_a_chat_completion(server):
    server.reply(body={"weird": True})
    res = judge(server)
    assert res.reward == 0.0 and "not a chat completion" in res.reason


def test_missing_template_key_sends_nothing(server):
    server.reply("5")
    res = judge(server, item={"question": "renamed"})
    assert res.reward == 0.0 and res.errors["invalid_variable_error"] is True
    assert server.requests == []


def test_batch_and_multi_with_a_judge(server):
    server.reply("8")
    spec = {
        "type": "multi",
        "name": "m",
        "graders": {
            "judge": SPEC,
            "exact": {
                "type": "string_check",
                "name": "exact",
                "input": "{{ sample.output_text }}",
                "reference": "Paris",
                "operation": "eq",
            },
        },
        "calculate_output": "judge / 10 * 0.5 + exact * 0.5",
    }
    ctx = ctx_for(server)
    g = validate_grader(spec, ctx)
    res = grade_batch_sync(
        g, [(o, {"q": "q"}) for o in ("Paris", "Lyon", "Paris")], ctx
    )
    assert [r.reward for r in res] == pytest.approx([0.9, 0.4, 0.9])
    assert len(server.requests) == 3
    assert res[0].sub_rewards == {"judge": 8.0, "exact": 1.0}
    assert res[0].metadata["token_usage"] == 22


COSINE = {
    "type": "text_similarity",
    "name": "cos",
    "input": "{{ sample.output_text }}",
    "reference": "{{ item.ref }}",
    "evaluation_metric": "cosine",
}


def test_cosine_uses_the_configured_embedding_model(server):
    server.embeddings = {"a cat": [1.0, 0.0, 0.0], "a kitten": [1.0, 1.0, 0.0]}
    ctx = GradingContext(
        embedding_base_url=server.base_url,
        embedding_model="embed-small",
        embedding_api_key="sk-emb",
    )
    g = validate_grader(COSINE, ctx)
    res = run_grader_sync(g, "a cat", {"ref": "a kitten"}, ctx)
    assert res.reward == pytest.approx(1 / math.sqrt(2))
    path, headers, body = server.requests[0]
    assert path == "/v1/embeddings" and headers["Authorization"] == "Bearer sk-emb"
    assert body == {"model": "embed-small", "input": ["a cat", "a kitten"]}
    server.replies.append((500, {"error": {"message": "down"}}, 0.0))
    server.replies.append((500, {"error": {"message": "down"}}, 0.0))
    res = run_grader_sync(g, "a cat", {"ref": "a kitten"}, ctx)
    assert res.reward == 0.0 and "HTTP 500" in res.reason
