"""``marlaas search-server``: the BM25 index of a jsonl corpus behind HTTP, with an
optional injected latency.

* ``POST /search {"query": str, "k": int}`` ->
  ``{"passages": [{id, title, text, score}], "latency_s": float, "injected_s": float}``
  (``latency_s``: the server's time for the request, injected delay included);
* ``POST /tools/search``: the same search as a tenant's tool in OpenAI's Agent
  RFT protocol: a Responses-API ``function_call`` item (``arguments``: JSON text
  of ``{"query": str, "k": int}``; ``item`` and ``trace_id`` are ignored) ->
  ``{"type": "function_call_output", "call_id", "output"}``, the passages as
  ``[title] text`` lines (a 400 text for arguments without a query);
* ``GET /health`` -> ``{"status": "ok", "passages", "worker", "workers", "pid"}``.

Latency injection stands in for a real web search API (a second or so per call,
with a long tail), so that benchmarks see the tool-wait regime: each request first
waits ``median_s * exp(sigma * N(0, 1))`` seconds (log-normal around the median),
asynchronously, so one worker holds many waiting requests at once as a remote API
would; the BM25 lookup then runs in a thread. Off by default (``median_s = 0``).

Workers: the parent loads the corpus and builds the index once, binds the socket
and forks ``workers`` processes that all accept on it (the index is shared
copy-on-write). Workers die with the parent (PDEATHSIG); the parent stops all of
them on SIGTERM/SIGINT or when one of them exits.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import multiprocessing
import multiprocessing.connection
import os
import random
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import uvicorn
from fastapi import FastAPI, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel, Field, ValidationError
from starlette.concurrency import run_in_threadpool

from areal_marlaas.rollout.reaper import set_pdeathsig
from areal_marlaas.tools.bm25 import BM25Index, Passage, format_passages

# Plain logging: importing AReaL (for its logger) would add seconds to the start.
logger = logging.getLogger("MARLaaSSearchServer")

MAX_K = 100
TOOL_PASSAGE_CHARS = 300  # of each passage in a tool reply (the search agent's)


@dataclass(frozen=True)
class Latency:
    """Injected per-request delay: log-normal with median ``median_s`` and shape
    ``sigma`` (0 = always the median); ``median_s = 0`` injects nothing."""

    median_s: float = 0.0
    sigma: float = 0.5
    seed: int | None = None

    def __post_init__(self):
        if self.median_s < 0 or self.sigma < 0:
            raise ValueError(
                f"latency median_s and sigma must be >= 0, got {self.median_s}, "
                f"{self.sigma}"
            )

    def sampler(self, stream: int = 0) -> Callable[[], float]:
        """Draws for one worker; seeded runs give each worker its own stream."""
        rng = random.Random(None if self.seed is None else f"{self.seed}:{stream}")
        median, sigma = self.median_s, self.sigma

        def draw() -> float:
            if median <= 0:
                return 0.0
            return median * math.exp(sigma * rng.gauss(0.0, 1.0))

        return draw

    def describe(self) -> str:
        if self.median_s <= 0:
            return "no injected latency"
        seed = "unseeded" if self.seed is None else f"seed {self.seed}"
        return (
            f"log-normal latency, median {self.median_s:g}s sigma {self.sigma:g} "
            f"({seed})"
        )


class SearchRequest(BaseModel):
    query: str
    k: int = Field(default=3, ge=1, le=MAX_K)


class FunctionCall(BaseModel):
    """A Responses-API ``function_call`` item (other keys, e.g. ``item`` and
    ``trace_id``, are accepted and unused)."""

    type: str = "function_call"
    call_id: str = ""
    name: str = ""
    arguments: str = "{}"


def create_app(
    index: BM25Index,
    latency: Latency | None = None,
    worker: int = 0,
    workers: int = 1,
) -> FastAPI:
    """The search app of one worker process."""
    draw = (latency or Latency()).sampler(worker)
    app = FastAPI(title="marlaas search", docs_url=None, redoc_url=None)

    @app.get("/health")
    async def health() -> dict:
        return {
            "status": "ok",
            "passages": len(index.docs),
            "worker": worker,
            "workers": workers,
            "pid": os.getpid(),
        }

    @app.post("/search")
    async def search(req: SearchRequest) -> dict:
        t0 = time.perf_counter()
        delay = draw()
        # uvloop's timers tick in milliseconds and may wake a sleep early: sleep
        # again until the whole drawn delay has passed.
        while (left := t0 + delay - time.perf_counter()) > 0:
            await asyncio.sleep(left)
        # A large corpus takes real CPU: off the loop, so waiting requests go on.
        passages = await run_in_threadpool(index.search, req.query, req.k)
        return {
            "passages": [asdict(p) for p in passages],
            "latency_s": time.perf_counter() - t0,
            "injected_s": delay,
        }

    @app.post("/tools/search")
    async def search_tool(call: FunctionCall) -> Response:
        try:
            args = json.loads(call.arguments or "{}")
            req = SearchRequest(**args) if isinstance(args, dict) else None
        except (json.JSONDecodeError, ValidationError, TypeError):
            req = None
        if req is None or not req.query.strip():
            return PlainTextResponse(
                'arguments must be {"query": <text>, "k": <1..100>}', status_code=400
            )
        found = await search(req)
        passages = [Passage(**p) for p in found["passages"]]
        return JSONResponse(
            {
                "type": "function_call_output",
                "call_id": call.call_id,
                "output": format_passages(passages, TOOL_PASSAGE_CHARS),
            }
        )

    return app


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket (``port`` 0 = a free one) for the workers to share."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def uvicorn_server(app: FastAPI) -> uvicorn.Server:
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="off",
        # Longer than the client's keep-alive (10s), so the server never closes
        # a connection just as the client reuses it (a spurious ReadError).
        timeout_keep_alive=30,
        timeout_graceful_shutdown=2,
    )
    return uvicorn.Server(config)


def _worker_main(
    sock: socket.socket, index: BM25Index, latency: Latency, worker: int, workers: int
) -> None:
    set_pdeathsig(signal.SIGTERM)  # never outlive the parent
    uvicorn_server(create_app(index, latency, worker, workers)).run(sockets=[sock])


def serve(
    corpus: str | Path,
    host: str = "127.0.0.1",
    port: int = 8100,
    workers: int = 1,
    latency: Latency | None = None,
) -> int:
    """Run the server in the foreground until SIGTERM/SIGINT; the exit status."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    latency = latency or Latency()
    if not logging.getLogger().handlers:
        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s: %(message)s"
        )
        logging.getLogger("bm25s").setLevel(logging.WARNING)
    t0 = time.monotonic()
    index = BM25Index.from_jsonl(corpus)
    sock = bind_socket(host, port)
    port = sock.getsockname()[1]
    logger.info(
        f"search server on http://{host}:{port}: {len(index.docs)} passages of "
        f"{corpus}, {workers} worker(s), {latency.describe()}; index built in "
        f"{time.monotonic() - t0:.1f}s"
    )
    if workers == 1:
        _worker_main(sock, index, latency, 0, 1)
        return 0
    ctx = multiprocessing.get_context("fork")
    procs = [
        ctx.Process(
            target=_worker_main,
            args=(sock, index, latency, i, workers),
            name=f"marlaas-search-{i}",
        )
        for i in range(workers)
    ]
    for p in procs:
        p.start()
    sock.close()  # the workers hold it
    stopping: list[int] = []
    prev = {
        sig: signal.signal(sig, lambda signum, _f: stopping.append(signum))
        for sig in (signal.SIGTERM, signal.SIGINT)
    }
    rc = 0
    try:
        while not stopping:
            multiprocessing.connection.wait([p.sentinel for p in procs], timeout=0.5)
            dead = [p for p in procs if not p.is_alive()]
            if dead and not stopping:
                logger.error(
                    f"search worker {dead[0].name} exited with {dead[0].exitcode}; "
                    "stopping the server"
                )
                rc = 1
                break
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join(5)
        for sig, handler in prev.items():
            signal.signal(sig, handler)
    logger.info(f"search server on port {port} stopped")
    return rc
