"""BM25 retrieval over a jsonl corpus of ``{id, title, text}`` passages.

Free of AReaL imports: ``marlaas search-server`` loads only this, fastapi and
uvicorn, so it starts in about a second (AReaL's import alone takes several).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Passage:
    id: str
    title: str
    text: str
    score: float


class BM25Index:
    """BM25 (bm25s, k1=1.2, b=0.75) over ``title + text`` of a jsonl corpus."""

    def __init__(self, docs: list[dict]):
        import bm25s

        if not docs:
            raise ValueError("empty corpus")
        self.docs = docs
        texts = [f"{d.get('title', '')} {d['text']}" for d in docs]
        self._bm25s = bm25s
        self.retriever = bm25s.BM25(k1=1.2, b=0.75)
        tokens = bm25s.tokenize(texts, stopwords="en", show_progress=False)
        self.retriever.index(tokens, show_progress=False)

    @classmethod
    def from_jsonl(cls, path: str | Path) -> BM25Index:
        docs = []
        with open(path) as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                rec = json.loads(line)
                if "text" not in rec:
                    raise ValueError(f"{path}:{n}: corpus record has no 'text'")
                docs.append(rec)
        return cls(docs)

    def search(self, query: str, k: int) -> list[Passage]:
        toks = self._bm25s.tokenize(
            [query], stopwords="en", return_ids=False, show_progress=False
        )[0]
        vocab = self.retriever.vocab_dict
        toks = [t for t in toks if t in vocab]
        if not toks:
            return []
        ids, scores = self.retriever.retrieve(
            # return_ids=False: the tokens are strings; bm25s types either.
            [toks],  # pyright: ignore[reportArgumentType]
            k=min(k, len(self.docs)),
            show_progress=False,
        )
        out = []
        for i, s in zip(ids[0].tolist(), scores[0].tolist(), strict=True):
            if s <= 0:
                continue
            d = self.docs[i]
            out.append(Passage(str(d.get("id", i)), d.get("title", ""), d["text"], s))
        return out


def format_passages(passages: list[Passage], max_chars: int) -> str:
    if not passages:
        return "No results."
    lines = []
    for p in passages:
        text = p.text if len(p.text) <= max_chars else p.text[:max_chars] + "..."
        lines.append(f"[{p.title}] {text}")
    return "\n".join(lines)
