"""A supervised task the base model does poorly and a few SFT (or DPO) steps
teach: "Say <word> three times, separated by commas." for made-up words,
answered exactly "<word>, <word>, <word>" (the small instruct model chats
around it instead); as DPO pairs, that answer is preferred over the word said
twice. Held out by construction: the training, validation and test words
are disjoint slices of one pool of distinct words (``lookup_task.words``).
"""

from __future__ import annotations

import json
from pathlib import Path

from areal_marlaas.bench.lookup_task import words


def prompt(word: str) -> str:
    return f"Say {word} three times, separated by commas."


def answer(word: str) -> str:
    return ", ".join([word] * 3)


def row(word: str) -> dict:
    """A supervised example (OpenAI's chat format) with its exact answer."""
    return {
        "messages": [
            {"role": "user", "content": prompt(word)},
            {"role": "assistant", "content": answer(word)},
        ]
    }


def preference_row(word: str, rejected: str | None = None) -> dict:
    """A DPO example (OpenAI's format): the exact answer preferred over
    ``rejected`` (default: a near miss that says the word twice; a bench may
    give the base model's own answer, as on-policy preference data does)."""
    worse = ", ".join([word] * 2) if rejected is None else rejected
    return {
        "input": {"messages": [{"role": "user", "content": prompt(word)}]},
        "preferred_output": [{"role": "assistant", "content": answer(word)}],
        "non_preferred_output": [{"role": "assistant", "content": worse}],
    }


def write_echo_data(
    out: Path,
    train: int,
    valid: int,
    test: int,
    seed: int = 0,
    preference: bool = False,
    rejected=None,
):
    """``train.jsonl``, ``valid.jsonl`` and ``test.jsonl`` under ``out`` with
    disjoint words (``preference``: DPO pairs instead of demonstrations, their
    rejected answer ``rejected(word)`` when given); returns their paths."""
    pool = words(train + valid + test, seed)
    out.mkdir(parents=True, exist_ok=True)
    splits = {
        "train": pool[:train],
        "valid": pool[train : train + valid],
        "test": pool[train + valid :],
    }
    paths = {}
    for split, ws in splits.items():
        path = out / f"{split}.jsonl"
        if preference:
            rows = [preference_row(w, rejected and rejected(w)) for w in ws]
        else:
            rows = [row(w) for w in ws]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        paths[split] = path
    return paths
