"""Synthetic arithmetic tasks generated from a seed: no files, exact rewards.

``holdout`` splits the problem space itself: a problem (a, b), taken as {a, b} for
the commutative operations here, belongs to the held-out ``test`` split when a hash
of it falls in the held-out fraction, else to ``train``. Whatever the seeds, no
test problem is ever a training problem (nor its mirror b op a).
"""

from __future__ import annotations

import random

from areal_marlaas.tasks.splits import check_split, in_holdout

OPS = {
    "addition": ("+", lambda a, b: a + b),
    "multiplication": ("*", lambda a, b: a * b),
}
OP_WORDS = {"addition": "plus", "multiplication": "times"}


def held_out(op: str, a: int, b: int, holdout: float) -> bool:
    """Whether problem ``a op b`` is in the held-out (test) split."""
    lo, hi = sorted((a, b))  # both operations here commute
    return in_holdout(f"{op}:{lo}:{hi}", holdout)


def _range(digits: int) -> tuple[int, int]:
    return (0 if digits == 1 else 10 ** (digits - 1)), 10**digits - 1


def make_arithmetic_rows(
    op: str,
    size: int,
    digits: int,
    seed: int,
    split: str = "train",
    holdout: float = 0.0,
    digits2: int | None = None,
) -> list[dict]:
    """``size`` seeded questions "What is a <op> b?" with integer answers; ``a``
    has ``digits`` digits, ``b`` ``digits2`` (default the same). With
    ``holdout`` > 0, only the problems of ``split``."""
    if op not in OPS:
        raise ValueError(f"unknown arithmetic op {op!r}; expected one of {sorted(OPS)}")
    check_split(split, holdout)
    # The original stream when nothing is split (runs stay comparable).
    plain = holdout == 0 and digits2 is None
    rng = random.Random(
        f"{op}:{digits}:{seed}" if plain else f"{op}:{digits}:{digits2}:{seed}:{split}"
    )
    (lo, hi), (lo2, hi2) = _range(digits), _range(digits2 or digits)
    symbol, fn = OPS[op]
    rows = []
    while len(rows) < size:
        a, b = rng.randint(lo, hi), rng.randint(lo2, hi2)
        if holdout and held_out(op, a, b, holdout) != (split == "test"):
            continue
        question = f"What is {a} {OP_WORDS[op]} {b}?"
        rows.append(
            {
                "id": f"{op}-{seed}-{len(rows)}",
                "question": question,
                "answer": str(fn(a, b)),
                "messages": [{"role": "user", "content": question}],
                "expr": f"{a} {symbol} {b}",
            }
        )
    return rows
