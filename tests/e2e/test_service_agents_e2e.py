"""Agent jobs live: ``marlaas service`` (the real trainer, the session's vLLM
server) runs OpenAI Agent RFT jobs submitted through the official ``openai``
SDK, whose tools and grader are real HTTP services on loopback that log every
request. The small model calls tools because each row carries two few-shot
demonstrations (part of the row, as OpenAI allows). Slow: ``make test-live``."""

from __future__ import annotations

import json
import random

import httpx
import pytest

from areal_marlaas.rundir.reader import read_jsonl
from tests.support.service_live import BASE, LiveService, wait_all
from tests.support.tool_server import ToolServer

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

SECRET_TOOL = "Bearer sk-tool-secret-7781"
SECRET_GRADER = "Bearer sk-grader-secret-9923"
WORDS = ["apple", "river", "cloud", "stone", "maple", "comet", "tiger", "ocean"]
SCHEMAS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "The secret code of a word.",
            "parameters": {
                "type": "object",
                "properties": {"key": {"type": "string"}},
                "required": ["key"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "echo",
            "description": "Repeats its arguments.",
            "parameters": {"type": "object"},
        },
    },
]


def codes(seed: int = 0) -> dict[str, str]:
    rng = random.Random(seed)
    return {w: str(rng.randint(1000, 9999)) for w in WORDS}


def demo(word: str, code: str) -> list[dict]:
    args = json.dumps({"key": word})
    return [
        {"role": "user", "content": f"What is the secret code of {word}?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": f"call_{word}",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": args},
                }
            ],
        },
        {"role": "tool", "tool_call_id": f"call_{word}", "content": code},
        {"role": "assistant", "content": f"The code is {code}."},
    ]


def rows(table: dict[str, str], words: list[str], split: str) -> bytes:
    """Lines whose answer only the tool knows; ``split`` marks the file."""
    a, b = "apple", "river"
    out = []
    for w in words:
        messages = [
            *demo(a, table[a]),
            *demo(b, table[b]),
            {"role": "user", "content": f"What is the secret code of {w}?"},
        ]
        out.append(
            {"messages": messages, "tools": SCHEMAS, "answer": table[w], "split": split}
        )
    return "".join(json.dumps(r) + "\n" for r in out).encode()


@pytest.fixture(scope="module")
def service(tmp_path_factory, vllm_server):
    """A service shaped for agent episodes (turns of up to 48 tokens: a call
    is about 30 to 40; a 200-token episode), allowed to reach tools on this
    machine, with a tool timeout short enough for a test, sampling at 0.5."""
    live = LiveService(
        tmp_path_factory.mktemp("agents"),
        [
            "service.max_new_tokens=48",
            # The 135M model copies the demonstrated call format far more
            # often at 0.5 than at 1.0 (12 of 16 samples against 1 of 10).
            "service.temperature=0.5",
            "service.agent_episode_tokens=200",
            "service.agent_max_prompt_tokens=560",
            "service.max_running_jobs=2",
            "service.poll_interval_s=0.3",
            "service.tool_timeout_s=5",
            "service.egress.allow=['127.0.0.0/8']",
            "scheduler.type=local",
        ],
        vllm=vllm_server.address,
    )
    live.start()
    yield live
    live.stop()


def agent_method(srv: ToolServer, grader_url: str, **hp) -> dict:
    return {
        "type": "reinforcement",
        "reinforcement": {
            "grader": {
                "type": "endpoint",
                "name": "codes",
                "url": grader_url,
                "headers": {"Authorization": SECRET_GRADER},
                "rate_limit": 50,
            },
            "tools": [
                {
                    "name": n,
                    "server_url": srv.tool_url(n),
                    "headers": {"Authorization": SECRET_TOOL},
                }
                for n in ("lookup", "echo")
            ],
            "max_episode_steps": 3,
            "hyperparameters": {
                "batch_size": 2,
                "n_epochs": 1,
                "compute_multiplier": 0.5,
                **hp,
            },
        },
    }


def test_an_agent_job_calls_its_tools_and_grader_and_trains(service):
    live = service
    a = live.add_tenant("agents")
    table = codes()
    with live.on_failure(), ToolServer(table) as srv:
        train = a.files.create(
            file=("t.jsonl", rows(table, WORDS[2:6], "train")), purpose="fine-tune"
        )
        valid = a.files.create(
            file=("v.jsonl", rows(table, WORDS[6:], "valid")), purpose="fine-tune"
        )
        j = a.fine_tuning.jobs.create(
            model=BASE,
            training_file=train.id,
            validation_file=valid.id,
            method=agent_method(srv, f"{srv.url}/grade", eval_samples=2),
        )
        job = wait_all(a, [j.id], 1200)[j.id]
        assert job.status == "succeeded", (job.error, live.tail())

        calls = srv.tool_calls()
        train_calls = [c for c in calls if c["body"]["item"]["split"] == "train"]
        assert train_calls, "the model never called a tool"
        # Responses-API function_call items with the row as item.
        for c in calls:
            body = c["body"]
            assert body["type"] == "function_call"
            assert body["id"].startswith("fc_") and body["call_id"].startswith("call_")
            assert isinstance(json.loads(body["arguments"]), dict)
            assert body["item"]["tools"] == SCHEMAS and "messages" in body["item"]
            assert c["headers"]["Authorization"] == SECRET_TOOL
        # Every rollout that called a tool was graded under the same trace id.
        graded = {g["body"]["trace_id"] for g in srv.grades}
        assert {c["body"]["trace_id"] for c in calls} <= graded
        assert all(g["headers"]["Authorization"] == SECRET_GRADER for g in srv.grades)

        # Each step's tool metrics are the tool server's own counts.
        events = list(a.fine_tuning.jobs.list_events(j.id, limit=100))
        metrics = [e.data for e in events if e.type == "metrics"]
        assert len(metrics) == job.steps_total  # type: ignore[attr-defined]
        total = lambda key: sum(m["tools"][key] for m in metrics)  # noqa: E731
        assert total("sent") == len(train_calls)
        # Errors: the calls the server refused, and those never sent (the
        # model named no known tool or wrote no JSON).
        failed = [c for c in train_calls if c["status"] != 200]
        assert total("errors") == len(failed) + total("calls") - total("sent")
        assert all(m["discarded_groups"] == 0 for m in metrics)

        # /metrics counts the same calls (the operator's view).
        scrape = httpx.get(
            f"http://127.0.0.1:{live.port}/metrics",
            headers={"Authorization": f"Bearer {live.admin_key()}"},
        ).text
        tenant = job.organization_id
        ok = total("calls") - total("errors")
        assert (
            f'marlaas_tool_calls_total{{outcome="ok",tenant="{tenant}"}} {ok}.0'
            in scrape
        )
        err = f'marlaas_tool_calls_total{{outcome="error",tenant="{tenant}"}}'
        assert f"{err} {total('errors')}.0" in scrape

        # The trainer re-scored every generated token: tool outputs carried
        # loss mask 0 (a tool token trained on would have no server logprob).
        steps = read_jsonl(live.run_dir / "steps.jsonl")
        mine = [s for s in steps if "tools" in s]
        assert mine and all(s["logprob_gap_max"] < 0.05 for s in mine)

        # Eval output items show the whole conversation.
        runs = a.evals.runs.list(job.eval_id).data  # type: ignore[attr-defined]
        items = a.evals.runs.output_items.list(
            runs[0].id,
            eval_id=job.eval_id,  # type: ignore[attr-defined]
        ).data
        roles = [[m.role for m in i.sample.output] for i in items]
        assert any("tool" in r for r in roles), roles

        # The tenant's header values appear in no API response, event, log
        # line or file of the run directory.
        public = json.dumps(
            [
                a.fine_tuning.jobs.retrieve(j.id).model_dump(),
                [e.model_dump() for e in events],
                [c.model_dump() for c in a.fine_tuning.jobs.checkpoints.list(j.id)],
                [i.model_dump() for i in items],
                a.evals.retrieve(job.eval_id).model_dump(),  # type: ignore[attr-defined]
            ]
        )
        assert "sk-tool-secret" not in public and "sk-grader-secret" not in public
        for path in live.root.rglob("*"):
            # The store itself keeps them (the rollouts need them).
            if path.is_file() and not path.name.startswith("service.db"):
                data = path.read_bytes()
                assert b"sk-tool-secret" not in data, path
                assert b"sk-grader-secret" not in data, path


def test_a_grader_endpoint_that_is_down_fails_the_job_naming_it(service):
    live = service
    a = live.add_tenant("down")
    table = codes(1)
    with live.on_failure(), ToolServer(table) as srv:
        srv.grader_down = True
        train = a.files.create(
            file=("t.jsonl", rows(table, WORDS[2:4], "train")), purpose="fine-tune"
        )
        j = a.fine_tuning.jobs.create(
            model=BASE,
            training_file=train.id,
            method=agent_method(srv, f"{srv.url}/grade"),
        )
        job = wait_all(a, [j.id], 900)[j.id]
        assert job.status == "failed"
        assert job.error and "endpoint grader 'codes'" in job.error.message
        assert srv.url.replace("http://", "") in job.error.message
        # A rollout's grading was tried 4 times (3 retries), never more, and
        # never scored: no step was committed.
        tries: dict[str, int] = {}
        for g in srv.grades:
            tries[g["body"]["trace_id"]] = tries.get(g["body"]["trace_id"], 0) + 1
        assert max(tries.values()) == 4, tries
        assert not a.fine_tuning.jobs.checkpoints.list(j.id).data


def search_demo(question: str, query: str, passage: str, answer: str) -> list[dict]:
    args = json.dumps({"query": query})
    return [
        {"role": "user", "content": question},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_demo",
                    "type": "function",
                    "function": {"name": "search", "arguments": args},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_demo", "content": passage},
        {"role": "assistant", "content": answer},
    ]


def search_row(question: str, answer: str) -> dict:
    """A wiki-search line: three demonstrations of the search tool, then the
    question (the paper's agentic task, as a tenant submits it). With two
    demonstrations the model called ``search`` in 23/32 and 5/32 first turns
    of these two questions at temperature 0.5 (no search in a job's four
    first turns about 1 time in 18); with three, 32/32 and 31/32."""
    messages = [
        *search_demo(
            "Who directed the film Heat?",
            "Heat film",
            "[Heat (1995 film)] Heat is a 1995 crime film directed by Michael Mann.",
            "Michael Mann.",
        ),
        *search_demo(
            "Who directed the film Titanic?",
            "Titanic film",
            "[Titanic (1997 film)] Titanic is a 1997 film directed by James Cameron.",
            "James Cameron.",
        ),
        *search_demo(
            "Who directed the film Alien?",
            "Alien film",
            "[Alien (film)] Alien is a 1979 science fiction horror film directed by "
            "Ridley Scott.",
            "Ridley Scott.",
        ),
        {"role": "user", "content": question},
    ]
    search = {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search Wikipedia; returns passages.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}},
                "required": ["query"],
            },
        },
    }
    return {"messages": messages, "tools": [search], "answer": answer}


@pytest.fixture
def search_server(tmp_path):
    """``marlaas search-server`` over the five-passage corpus, as a tenant (or
    the operator) runs it."""
    import subprocess
    import sys

    import httpx

    from areal_marlaas.rollout.server import free_port
    from tests.support.procs import wait_for
    from tests.support.search import CORPUS

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(d) + "\n" for d in CORPUS))
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "areal_marlaas.cli", "search-server"]
        + ["--corpus", str(corpus), "--port", str(port)],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def up() -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(up, 120, 0.5)
        yield f"http://127.0.0.1:{port}"
    finally:
        import os
        import signal

        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)


def test_the_wiki_search_task_as_a_service_job(service, search_server):
    live = service
    a = live.add_tenant("wiki")
    lines = [
        search_row("Who directed the film Jaws?", "Spielberg"),
        search_row("Who directed the 1975 film Jaws?", "Spielberg"),
    ]
    body = "".join(json.dumps(r) + "\n" for r in lines).encode()
    with live.on_failure():
        train = a.files.create(file=("wiki.jsonl", body), purpose="fine-tune")
        j = a.fine_tuning.jobs.create(
            model=BASE,
            training_file=train.id,
            method={
                "type": "reinforcement",
                "reinforcement": {
                    "grader": {
                        "type": "string_check",
                        "name": "has_answer",
                        "input": "{{ sample.output_text }}",
                        "reference": "{{ item.answer }}",
                        "operation": "ilike",
                    },
                    "tools": [
                        {
                            "name": "search",
                            "server_url": f"{search_server}/tools/search",
                        }
                    ],
                    "max_episode_steps": 3,
                    "hyperparameters": {
                        "batch_size": 2,
                        "n_epochs": 1,
                        "compute_multiplier": 0.5,
                    },
                },
            },
        )
        job = wait_all(a, [j.id], 900)[j.id]
        assert job.status == "succeeded", (job.error, live.tail())
        (m,) = [
            e.data for e in a.fine_tuning.jobs.list_events(j.id) if e.type == "metrics"
        ]
        # The model searched, and the search server answered its searches.
        assert m["tools"]["sent"] > 0
        assert m["tools"]["calls"] - m["tools"]["errors"] > 0
