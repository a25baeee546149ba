"""The search tool as a service: ``marlaas search-server`` (BM25 over HTTP, injected
latency, worker processes), the workflow's HTTP client (retries, timeouts, the
event loop stays free), ``search.server_url=auto`` and the config checks."""

from __future__ import annotations

import asyncio
import json
import math
import signal
import statistics
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import asdict

import httpx
import pytest
import torch
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from areal_marlaas.cli import main as cli_main
from areal_marlaas.config import (
    ConfigError,
    SearchConfig,
    TaskDatasetConfig,
    TaskSpec,
)
from areal_marlaas.rollout import reaper
from areal_marlaas.rollout.server import free_port
from areal_marlaas.tasks import load_task_rows
from areal_marlaas.tasks.search import BM25Index, get_index
from areal_marlaas.tools import search_client
from areal_marlaas.tools.local_search import (
    stop_local_search_servers,
)
from areal_marlaas.tools.search_client import SearchClient, SearchError, loop_session
from areal_marlaas.tools.search_server import (
    Latency,
    SearchRequest,
    bind_socket,
    create_app,
    uvicorn_server,
)
from areal_marlaas.workflows import task_workflow
from tests.support.paths import SHARED_DATA
from tests.support.procs import alive
from tests.support.search import CORPUS, ScriptedEngine, make_workflow, row, run

HOTPOT = SHARED_DATA / "hotpotqa"
TRAJ_KEYS = ("input_ids", "loss_mask", "logprobs", "versions", "attention_mask")
TURNS = [
    "Let me search. <search>Jaws film director</search>",
    "<search>Steven Spielberg born</search>",
    "He was born in Cincinnati. <answer>Cincinnati</answer>",
]
QUERIES = [
    "who directed the film Jaws",
    "where was Spielberg born",
    "wrought-iron tower in Paris",
    "shark ohio river city",
    "the of zzzqqq",  # no known word: no passages
]


class ThreadServer:
    """An app on uvicorn in a thread, on a free port (``url``)."""

    def __init__(self, app: FastAPI):
        self.sock = bind_socket("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn_server(app)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    def __enter__(self) -> ThreadServer:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "test server did not start"
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        # Requests still sleeping (a hung search) are dropped, not waited for.
        self.server.should_exit = self.server.force_exit = True
        self.thread.join(10)
        self.sock.close()


def flaky_app(index: BM25Index, fail: int, status: int = 503) -> FastAPI:
    """Answers ``status`` to the first ``fail`` searches, then searches."""
    app = FastAPI()
    app.state.calls = 0

    @app.post("/search")
    async def search(req: SearchRequest):
        app.state.calls += 1
        if app.state.calls <= fail:
            return JSONResponse({"detail": "busy"}, status_code=status)
        hits = index.search(req.query, req.k)
        return {"passages": [asdict(p) for p in hits], "latency_s": 0.0}

    return app


@pytest.fixture(scope="module")
def index() -> BM25Index:
    # Its own index, not the in-process cache: the comparisons below are real.
    return BM25Index([dict(d) for d in CORPUS])


def post(url: str, query: str, k: int = 3) -> dict:
    resp = httpx.post(f"{url}/search", json={"query": query, "k": k}, timeout=10)
    resp.raise_for_status()
    return resp.json()


def top_k(passages) -> list[tuple[str, str, float]]:
    return [(p["id"], p["title"], round(p["score"], 5)) for p in passages]


# -- the server ---------------------------------------------------------------------
def test_server_returns_the_in_process_top_k(index, corpus_path):
    local = get_index(corpus_path)
    with ThreadServer(create_app(index)) as srv:
        for query in QUERIES:
            for k in (1, 3):
                got = post(srv.url, query, k)
                want = [asdict(p) for p in local.search(query, k)]

                assert top_k(got["passages"]) == top_k(want), query
                assert [p["text"] for p in got["passages"]] == [p["text"] for p in want]
        assert post(srv.url, "the of zzzqqq")["passages"] == []
        health = httpx.get(f"{srv.url}/health").json()
        assert health["status"] == "ok" and health["passages"] == len(CORPUS)
        bad = httpx.post(f"{srv.url}/search", json={"query": "x", "k": 0})
        assert bad.status_code == 422


def test_server_answers_the_agent_rft_function_call_protocol(index):
    """The tool agent calls it like any tenant tool (agents/tool_client.py)."""
    import asyncio

    from areal_marlaas.agents.egress import EgressPolicy
    from areal_marlaas.agents.protocol import ToolEndpoint, parse_tool_calls
    from areal_marlaas.agents.tool_client import call_tool
    from areal_marlaas.tools.bm25 import format_passages

    query = "who directed the film Jaws"
    _, (ok, no_query) = parse_tool_calls(
        f'<tool_call>{{"name": "search", "arguments": {{"query": "{query}"}}}}'
        '</tool_call><tool_call>{"name": "search", "arguments": {}}</tool_call>'
    )
    with ThreadServer(create_app(index)) as srv:
        endpoint = ToolEndpoint("search", f"{srv.url}/tools/search")

        async def go(call):
            async with httpx.AsyncClient() as client:
                return await call_tool(
                    client,
                    EgressPolicy(("127.0.0.0/8",)),
                    endpoint,
                    call,
                    {"question": query},
                    "trace_1",
                    10.0,
                )

        res = asyncio.run(go(ok))
        assert res.output == format_passages(index.search(query, 3), 300)
        assert not res.error and res.output.startswith("[Jaws (film)]")
        bad = asyncio.run(go(no_query))
        assert bad.output.startswith("Error 400") and bad.error == "HTTP 400"


@pytest.mark.skipif(not HOTPOT.is_dir(), reason=f"no shared data at {HOTPOT}")
def test_server_on_the_hotpotqa_corpus_returns_the_in_process_top_k():
    corpus = HOTPOT / "corpus.jsonl"
    questions = []
    with open(HOTPOT / "train.jsonl") as f:
        for line in f:
            questions.append(json.loads(line)["question"])
            if len(questions) == 40:
                break
    served = BM25Index.from_jsonl(corpus)
    local = get_index(corpus)
    with ThreadServer(create_app(served)) as srv:
        for q in questions:
            want = [asdict(p) for p in local.search(q, 5)]

            assert top_k(post(srv.url, q, 5)["passages"]) == top_k(want), q


def test_latency_draws_follow_the_configured_median_and_seed():
    draws = Latency(1.0, 0.5, seed=7).sampler(0)
    xs = [draws() for _ in range(4001)]
    logs = [math.log(x) for x in xs]

    assert statistics.median(xs) == pytest.approx(1.0, rel=0.05)
    assert statistics.stdev(logs) == pytest.approx(0.5, rel=0.05)
    again = Latency(1.0, 0.5, seed=7).sampler(0)
    assert [again() for _ in range(5)] == xs[:5]
    other = Latency(1.0, 0.5, seed=7).sampler(1)  # another worker's stream
    assert [other() for _ in range(5)] != xs[:5]
    assert Latency(0.0).sampler()() == 0.0
    assert {Latency(0.3, 0.0).sampler()() for _ in range(3)} == {0.3}


def test_server_injects_its_latency_and_holds_waiting_requests_at_once(index):
    latency = Latency(0.5, 0.1, seed=3)

    async def calls(url: str, n: int):
        session = await loop_session()

        async def one(i: int):
            t0 = time.monotonic()
            async with session.post(f"{url}/search", json={"query": "Jaws"}) as r:
                body = await r.json()
            return time.monotonic() - t0, body

        t0 = time.monotonic()
        out = await asyncio.gather(*(one(i) for i in range(n)))
        return time.monotonic() - t0, out

    with ThreadServer(create_app(index, latency)) as srv:
        wall, out = asyncio.run(calls(srv.url, 100))

    injected = [body["injected_s"] for _, body in out]
    assert statistics.median(injected) == pytest.approx(0.5, rel=0.15)
    for seen, body in out:
        assert seen >= body["latency_s"] >= body["injected_s"] > 0
        assert body["passages"][0]["title"] == "Jaws (film)"
    # 100 requests of ~0.5 s each: waited for together (~0.7 s here, the longest
    # wait plus the client's and server's work), not one after another (~50 s);
    # relative to the summed waits, whatever the machine.
    assert wall < sum(injected) / 5


def test_cli_rejects_bad_latency_and_workers(capsys):
    corpus = ["--corpus", "c.jsonl"]
    assert cli_main(["search-server", *corpus, "--latency-sigma", "-1"]) == 2
    assert cli_main(["search-server", *corpus, "--workers", "0"]) == 2
    assert "--workers must be >= 1" in capsys.readouterr().err


# -- the workflow over HTTP ---------------------------------------------------------
def http_workflow(tokenizer, url, **kw):
    # No corpus: the episode can only have searched through the server.
    return make_workflow(tokenizer, "", server_url=url, **kw)


def test_workflow_over_http_gives_the_in_process_trajectory(
    tokenizer,
    corpus_path,
    index,
):
    local_wf = make_workflow(tokenizer, corpus_path)
    local = run(local_wf, ScriptedEngine(tokenizer, TURNS), row())
    with ThreadServer(create_app(index)) as srv:
        wf = http_workflow(tokenizer, srv.url)
        remote = run(wf, ScriptedEngine(tokenizer, TURNS), row())

    assert wf.client is not None and wf.search_fn is None
    for key in (*TRAJ_KEYS, "rewards"):
        assert torch.equal(remote[key], local[key]), key
    assert remote["rewards"].item() == 1.0
    assert wf.outcomes[-1] == local_wf.outcomes[-1]
    assert wf.outcomes[-1]["tool_calls"] == 2 and wf.outcomes[-1]["tool_errors"] == []


def tool_text(tokenizer, traj) -> str:
    mask = traj["loss_mask"][0].bool()
    return tokenizer.decode(traj["input_ids"][0][~mask].tolist())


def test_hung_server_times_the_search_out_and_the_episode_goes_on(
    tokenizer,
    index,
):
    turns = ["<search>Jaws</search>", "<answer>Cincinnati</answer>"]
    hung = Latency(30.0, 0.0)  # answers long after tool_timeout_s
    with ThreadServer(create_app(index, hung)) as srv:
        wf = http_workflow(tokenizer, srv.url, tool_timeout_s=0.3)
        t0 = time.monotonic()
        traj = run(wf, ScriptedEngine(tokenizer, turns), row())
        took = time.monotonic() - t0

    # Cut at the 0.3 s tool timeout (~0.3 s here), not the server's 30 s.
    assert took < 10
    assert "Search timed out." in tool_text(tokenizer, traj)
    out = wf.outcomes[-1]
    assert out["tool_timeouts"] == 1
    assert out["tool_errors"] == ["search timed out after 0.3s"]
    assert out["reason"] == "" and traj["rewards"].item() == 1.0
    (start, end) = traj["env_intervals"]
    # The loop may fire its timer ~1 ms early; ~0.3 s here.
    assert 0.29 <= end - start < 10


@pytest.mark.parametrize("status", [503, 429])
def test_server_503_is_retried_then_the_search_succeeds(tokenizer, index, status):
    app = flaky_app(index, fail=2, status=status)
    with ThreadServer(app) as srv:
        wf = http_workflow(tokenizer, srv.url, server_backoff_s=0.05)
        traj = run(wf, ScriptedEngine(tokenizer, TURNS), row())

    assert app.state.calls == 4  # 503, 503, ok; then the second search
    assert wf.outcomes[-1]["tool_errors"] == [] and traj["rewards"].item() == 1.0
    assert "[Jaws (film)]" in tool_text(tokenizer, traj)


@pytest.mark.parametrize(
    "fail,status,retries,backoff,timeout,calls,error",
    [
        # Retries run out: the last error and how many attempts.
        (9, 503, 2, 0.01, 5.0, 3, "search error: HTTP 503 (after 3 attempts)"),
        # A 4xx is the request's fault: no retry.
        (9, 404, 2, 0.01, 5.0, 1, "search error: HTTP 404: "),
        # Pauses count against the budget: it runs out mid-backoff (the 503
        # answers in ms, the 5 s pause outlasts the 1 s budget).
        (9, 503, 5, 5.0, 1.0, 1,
         "search timed out after 1.0s (last error: HTTP 503)"),
    ],
)  # fmt: skip
def test_failing_server_search_fails_with_its_reason(
    tokenizer,
    index,
    fail,
    status,
    retries,
    backoff,
    timeout,
    calls,
    error,
):
    turns = ["<search>Jaws</search>", "<answer>Cincinnati</answer>"]
    app = flaky_app(index, fail=fail, status=status)
    with ThreadServer(app) as srv:
        wf = http_workflow(
            tokenizer,
            srv.url,
            server_retries=retries,
            server_backoff_s=backoff,
            tool_timeout_s=timeout,
        )
        traj = run(wf, ScriptedEngine(tokenizer, turns), row())

    (got,) = wf.outcomes[-1]["tool_errors"]
    assert got.startswith(error) and app.state.calls == calls
    text = tool_text(tokenizer, traj)
    assert ("Search timed out." if "timed out" in error else "Search failed.") in text
    assert traj["rewards"].item() == 1.0  # the episode went on and was scored


def test_unreachable_server_fails_the_search_after_retries():
    client = SearchClient(f"http://127.0.0.1:{free_port()}", 2, 0.01)

    with pytest.raises(SearchError, match=r"ClientConnectorError.*after 3 attempts"):
        asyncio.run(client.search("Jaws", 3, 5.0))


def test_env_intervals_cover_the_injected_latency(tokenizer, index):
    with ThreadServer(create_app(index, Latency(0.2, 0.0))) as srv:
        wf = http_workflow(tokenizer, srv.url)
        traj = run(wf, ScriptedEngine(tokenizer, TURNS), row())

    env = traj["env_intervals"]
    assert len(env) == 4
    for start, end in zip(env[::2], env[1::2], strict=False):
        assert end - start >= 0.2


def test_a_waiting_search_leaves_the_event_loop_free(index):
    async def main(url: str) -> tuple[int, list]:
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        task = asyncio.create_task(ticker())
        hits = await SearchClient(url).search("Jaws", 2, 5.0)
        task.cancel()
        return ticks, hits

    with ThreadServer(create_app(index, Latency(0.5, 0.0))) as srv:
        ticks, hits = asyncio.run(main(srv.url))

    # ~50 ticks of 10 ms while the search waits 0.5 s; a search that blocked
    # the loop would leave the ticker none until it returned.
    assert ticks >= 5 and hits[0].title == "Jaws (film)"


def test_one_http_session_per_event_loop_closed_with_the_loop():
    async def two():
        return await loop_session(), await loop_session()

    a, b = asyncio.run(two())
    c, _ = asyncio.run(two())

    assert a is b and a is not c
    assert a.closed and c.closed and len(search_client._SESSIONS) == 0


# -- search.server_url=auto -----------------------------------------------------------
def group_pids(pgid: int) -> list[int]:
    """The reaper (the group leader) and everything under it."""
    return reaper.group_members(pgid)


def test_auto_server_outlives_the_launching_thread_and_stops_with_the_run(
    tmp_path,
    corpus_path,
):
    task = wiki_task(
        tmp_path,
        corpus_path=str(corpus_path),
        server_url="auto",
        latency_median_s=0.05,
        latency_sigma=0.0,
    )
    box = {}
    # Benches resolve workflows on short-lived threads: PDEATHSIG must not fire.
    t = threading.Thread(target=lambda: box.update(kw=task_workflow(task, "tok")[1]))
    t.start()
    t.join()
    time.sleep(1.0)  # a PDEATHSIG from the thread's end would have landed by now
    try:
        url = box["kw"]["server_url"]
        assert url.startswith("http://127.0.0.1:")
        # The same server for a second task with the same corpus and latency.
        assert task_workflow(task, "tok")[1]["server_url"] == url
        health = httpx.get(f"{url}/health", timeout=5).json()
        assert health["workers"] == 2 and health["passages"] == len(CORPUS)
        got = post(url, "where was Spielberg born", 2)
        want = [asdict(p) for p in get_index(corpus_path).search(QUERIES[1], 2)]
        assert top_k(got["passages"]) == top_k(want)
        assert got["injected_s"] == 0.05 and got["latency_s"] >= 0.05
        from areal_marlaas.tools import local_search

        (server,) = local_search._SERVERS.values()
        pids = group_pids(server.process.pid)
        assert len(pids) == 4  # reaper, server, 2 workers
        assert all(alive(p) for p in pids)
    finally:
        stop_local_search_servers()

    assert not any(alive(p) for p in pids)
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/health", timeout=2)


# A "trainer" that starts an auto server, prints its pids, then waits to be killed.
LAUNCHER = textwrap.dedent(
    """
    import sys, time
    from areal_marlaas.rollout import reaper
    from areal_marlaas.tools import local_search as ls
    ls.local_search_server(ls.LocalSearchSpec(sys.argv[1], workers=2))
    (server,) = ls._SERVERS.values()
    pgid = server.process.pid
    print("PIDS", *reaper.group_members(pgid), flush=True)
    time.sleep(600)
    """
)


@pytest.mark.slow  # two cold interpreter starts (~20 s on 2 busy cores)
def test_sigkilled_trainer_leaves_no_auto_search_server(corpus_path):
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(corpus_path)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = next(x for x in launcher.stdout if x.startswith("PIDS"))
        pids = [int(p) for p in line.split()[1:]]
        assert len(pids) == 4 and all(alive(p) for p in pids)
    finally:
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()

    deadline = time.monotonic() + 20
    while any(alive(p) for p in pids):
        assert time.monotonic() < deadline, "search server outlived its trainer"
        time.sleep(0.1)


# -- config -------------------------------------------------------------------------
def wiki_task(tmp_path, **search) -> TaskSpec:
    data = tmp_path / "qa.jsonl"
    data.write_text(json.dumps({"question": "Who?", "answer": "Ann"}) + "\n")
    return TaskSpec(
        name="wiki",
        kind="wiki_search",
        dataset=TaskDatasetConfig(path=str(data)),
        search=SearchConfig(**search),
    )


@pytest.mark.parametrize(
    "search,field",
    [
        ({"server_url": "localhost:8100"}, "search.server_url"),
        ({"server_url": "auto", "corpus_path": ""}, "search.corpus_path"),
        ({"server_retries": -1}, "search.server_retries"),
        ({"server_backoff_s": -0.1}, "search.server_backoff_s"),
        ({"server_workers": 0, "server_url": "auto"}, "search.server_workers"),
        ({"latency_median_s": -1.0, "server_url": "auto"}, "search.latency_median_s"),
        ({"latency_sigma": -1.0, "server_url": "auto"}, "search.latency_sigma"),
        ({"latency_median_s": 1.0}, "search.server_url=auto"),
        ({"latency_median_s": 1.0, "server_url": "http://h:1"},
         "search.latency_median_s"),
        ({"corpus_path": ""}, "search.corpus_path"),
    ],
)  # fmt: skip
def test_bad_search_server_settings_name_the_field(tmp_path, search, field):
    search = {"corpus_path": "c.jsonl", **search}

    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        wiki_task(tmp_path, **search)


def test_remote_server_needs_no_local_corpus(tmp_path):
    task = wiki_task(tmp_path, server_url="http://search:8100", server_retries=4)

    path, kwargs = task_workflow(task, "tok")
    (r,) = load_task_rows(task)

    assert kwargs["server_url"] == "http://search:8100"
    assert kwargs["corpus_path"] == "" and kwargs["server_retries"] == 4
    assert r["answer"] == "Ann" and path.endswith("SearchAgentWorkflow")
