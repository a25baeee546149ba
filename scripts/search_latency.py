"""The search tool over HTTP: what a search costs in process vs through
``marlaas search-server``, and the latency the server injects.

Starts the server the way ``search.server_url=auto`` does (under the reaper, 2
workers), once without injection and once with ``--median`` / ``--sigma``, and
times HotpotQA questions as queries:

* in process: ``SearchAgentWorkflow.search`` on the local BM25 index (thread pool);
* HTTP: the same call with ``server_url`` set (one query at a time: the overhead);
* injected: ``--n`` queries at once against the injecting server, on fresh
  connections and again on pooled ones (median, p90 of what the client saw, of
  what the server drew, and of the difference).

    python scripts/search_latency.py [--corpus C] [--questions Q] [--n 200]
        [--median 1.0] [--sigma 0.5] [--out docs/results/search_latency.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

from areal.api.cli_args import GenerationHyperparameters

from areal_marlaas.model_prep import prepare_default_model
from areal_marlaas.tools.local_search import LocalSearchServer, LocalSearchSpec
from areal_marlaas.tools.search_client import loop_session
from areal_marlaas.workflows.search_agent import SearchAgentWorkflow

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "hotpotqa"


def quantiles(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    return {
        "n": len(xs),
        "median_ms": 1e3 * statistics.median(xs),
        "mean_ms": 1e3 * statistics.fmean(xs),
        "p90_ms": 1e3 * xs[int(0.9 * (len(xs) - 1))],
    }


def workflow(corpus: str, url: str = "", tokenizer=None) -> SearchAgentWorkflow:
    return SearchAgentWorkflow(
        task="wiki",
        reward_fn="areal_marlaas.tasks.search.qa_em_reward_fn",
        gconfig=GenerationHyperparameters(max_new_tokens=64),
        tokenizer=tokenizer,
        corpus_path=corpus,
        server_url=url,
        tool_timeout_s=60.0,
    )


async def one_by_one(wf: SearchAgentWorkflow, queries: list[str]) -> list[float]:
    await wf.search(queries[0])  # warm: the index / the connection
    out = []
    for q in queries:
        t0 = time.perf_counter()
        _, err = await wf.search(q)
        out.append(time.perf_counter() - t0)
        assert not err, err
    return out


async def all_at_once(url: str, queries: list[str]) -> dict[str, dict]:
    """Every query at once, twice: on fresh connections, then on the pooled ones.
    Per round: what the client saw, what the server drew, and the difference."""
    session = await loop_session()

    async def one(q: str) -> tuple[float, float]:
        t0 = time.perf_counter()
        async with session.post(f"{url}/search", json={"query": q, "k": 3}) as r:
            body = await r.json()
        return time.perf_counter() - t0, body["injected_s"]

    out = {}
    for rnd in ("cold", "warm"):
        pairs = await asyncio.gather(*(one(q) for q in queries))
        out[rnd] = {
            "client": quantiles([seen for seen, _ in pairs]),
            "server_drawn": quantiles([drawn for _, drawn in pairs]),
            "client_minus_drawn": quantiles([seen - drawn for seen, drawn in pairs]),
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default=str(DATA / "corpus.jsonl"))
    ap.add_argument("--questions", default=str(DATA / "train.jsonl"))
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--median", type=float, default=1.0)
    ap.add_argument("--sigma", type=float, default=0.5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    with open(args.questions) as f:
        queries = [
            json.loads(line)["question"]
            for _, line in zip(range(args.n), f, strict=False)
        ]
    from areal.utils.hf_utils import load_hf_tokenizer

    tok = load_hf_tokenizer(str(prepare_default_model()))
    # The corpus by its folder and name: no machine paths in the JSON.
    corpus = "/".join(Path(args.corpus).resolve().parts[-2:])
    result: dict = {"queries": len(queries), "corpus": corpus}

    local = workflow(args.corpus, tokenizer=tok)
    result["in_process"] = quantiles(asyncio.run(one_by_one(local, queries)))

    plain = LocalSearchServer(LocalSearchSpec(args.corpus, workers=2))
    t0 = time.monotonic()
    url = plain.start()
    result["server_start_s"] = time.monotonic() - t0
    try:
        remote = workflow("", url, tok)
        result["http"] = quantiles(asyncio.run(one_by_one(remote, queries)))
    finally:
        plain.stop()
    result["http_overhead_ms"] = (
        result["http"]["median_ms"] - result["in_process"]["median_ms"]
    )

    spec = LocalSearchSpec(args.corpus, 2, args.median, args.sigma, latency_seed=1)
    slow = LocalSearchServer(spec)
    slow.start()
    try:
        rounds = asyncio.run(all_at_once(slow.url, queries))
    finally:
        slow.stop()
    result["injected"] = {"median_s": args.median, "sigma": args.sigma, **rounds}
    print(json.dumps(result, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
