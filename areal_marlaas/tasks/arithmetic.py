"""Synthetic arithmetic tasks generated from a seed: no files, exact rewards."""

from __future__ import annotations

import random

OPS = {
    "addition": ("+", lambda a, b: a + b),
    "multiplication": ("*", lambda a, b: a * b),
}
OP_WORDS = {"addition": "plus", "multiplication": "times"}


def make_arithmetic_rows(op: str, size: int, digits: int, seed: int) -> list[dict]:
    """``size`` distinct-seeded questions "What is a <op> b?" with integer answers."""
    if op not in OPS:
        raise ValueError(f"unknown arithmetic op {op!r}; expected one of {sorted(OPS)}")
    rng = random.Random(f"{op}:{digits}:{seed}")
    lo, hi = (0 if digits == 1 else 10 ** (digits - 1)), 10**digits - 1
    symbol, fn = OPS[op]
    rows = []
    for i in range(size):
        a, b = rng.randint(lo, hi), rng.randint(lo, hi)
        question = f"What is {a} {OP_WORDS[op]} {b}?"
        rows.append(
            {
                "id": f"{op}-{seed}-{i}",
                "question": question,
                "answer": str(fn(a, b)),
                "messages": [{"role": "user", "content": question}],
                "expr": f"{a} {symbol} {b}",
            }
        )
    return rows
