"""A tool task whose answer only the tool knows: "What is the secret code of
<key>?" where <key> is a made-up word and its 4-digit code lives only in a code
book that ``marlaas search-server`` serves as a ``search`` tool (OpenAI's Agent
RFT protocol, ``/tools/search``). Each entry holds the code among two other
4-digit numbers, fields shuffled, so answering means reading the right field.
Rows carry two few-shot demonstrations (demo keys of their own, with the
server's real replies) and the tool's function schema; ``answer`` is the exact
answer, "The code is NNNN.". Held out by construction: demo, training and eval
keys are disjoint slices of one pool of distinct words. Used by
``scripts/bench_tool_learning.py`` and ``marlaas bench-service``'s agentic
tenants."""

from __future__ import annotations

import json
import random
from pathlib import Path

from areal_marlaas.tools.bm25 import BM25Index, format_passages
from areal_marlaas.tools.search_server import TOOL_PASSAGE_CHARS

ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z"]
VOWELS = ["a", "e", "i", "o", "u"]
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the code book; returns matching entries.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}},
            "required": ["query"],
        },
    },
}


def words(n: int, seed: int) -> list[str]:
    """``n`` distinct three-syllable made-up words (no model knows their codes)."""
    rng = random.Random(seed)
    out: list[str] = []
    seen: set[str] = set()
    while len(out) < n:
        w = "".join(rng.choice(ONSETS) + rng.choice(VOWELS) for _ in range(3))
        if w not in seen:
            seen.add(w)
            out.append(w)
    return out


def question(key: str) -> str:
    return f"What is the secret code of {key}?"


def answer(code: str) -> str:
    """The answer the grader wants, exactly (the demonstrations' form)."""
    return f"The code is {code}."


def entry(key: str, code: str, rng: random.Random) -> str:
    """A code-book entry: the code among other 4-digit numbers, fields in a
    random order, so that the answer means reading the right field."""
    fields = [
        f"code {code}",
        f"shelf {rng.randint(1000, 9999)}",
        f"year {rng.randint(1000, 9999)}",
    ]
    rng.shuffle(fields)
    return f"{key}: " + ", ".join(fields) + "."


def demo(key: str, code: str, index: BM25Index) -> list[dict]:
    """A demonstration: the search call, the server's real reply, the answer."""
    found = index.search(key, 3)
    call_id = f"call_{key}"
    return [
        {"role": "user", "content": question(key)},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {
                        "name": "search",
                        "arguments": json.dumps({"query": key}),
                    },
                }
            ],
        },
        {
            "role": "tool",
            "tool_call_id": call_id,
            "content": format_passages(found, TOOL_PASSAGE_CHARS),
        },
        {"role": "assistant", "content": answer(code)},
    ]


def write_lookup_task(
    out: Path, n_train: int, n_eval: int, seed: int
) -> dict[str, int]:
    """corpus.jsonl, train.jsonl, eval.jsonl under ``out``; disjoint keys."""
    pool = words(2 + n_train + n_eval, seed)
    rng = random.Random(seed + 1)
    codes = {w: str(rng.randint(1000, 9999)) for w in pool}
    demos, train, held = pool[:2], pool[2 : 2 + n_train], pool[2 + n_train :]
    assert not set(train) & set(held) and not set(demos) & (set(train) | set(held))
    corpus = [
        {"id": i, "title": w, "text": entry(w, codes[w], rng)}
        for i, w in enumerate(pool)
    ]
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "corpus.jsonl", "w") as f:
        f.writelines(json.dumps(d) + "\n" for d in corpus)
    index = BM25Index(corpus)
    shots = [m for k in demos for m in demo(k, codes[k], index)]
    for name, keys in (("train", train), ("eval", held)):
        with open(out / f"{name}.jsonl", "w") as f:
            for k in keys:
                row = {
                    "messages": [*shots, {"role": "user", "content": question(k)}],
                    "tools": [SEARCH_TOOL],
                    "answer": answer(codes[k]),
                }
                f.write(json.dumps(row) + "\n")
    return {"demo": len(demos), "train": len(train), "eval": len(held)}
