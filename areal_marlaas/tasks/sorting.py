"""A synthetic list task: sort a few numbers, checked exactly.

``holdout`` splits the problem space itself: a problem is its multiset of
numbers, so no held-out problem is ever a training problem in any order.
"""

from __future__ import annotations

import hashlib
import random
import re

from areal_marlaas.tasks.arithmetic import SPLITS

_INT = re.compile(r"-?\d+")


def held_out(numbers: list[int], holdout: float) -> bool:
    """Whether the problem of sorting ``numbers`` (in any order) is held out."""
    key = ",".join(map(str, sorted(numbers)))
    digest = hashlib.sha256(f"sort:{key}".encode()).digest()
    return int.from_bytes(digest[:4], "little") / 2**32 < holdout


def make_sorting_rows(
    size: int,
    digits: int,
    items: int,
    seed: int,
    split: str = "train",
    holdout: float = 0.0,
) -> list[dict]:
    """``size`` seeded prompts "Sort these numbers from smallest to largest:
    ..." of ``items`` distinct numbers of up to ``digits`` digits; the answer is
    the sorted list, comma-separated."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {list(SPLITS)}, got {split!r}")
    if not 0 <= holdout < 1:
        raise ValueError(f"holdout must be in [0, 1), got {holdout}")
    if split == "test" and holdout == 0:
        raise ValueError("the test split needs holdout > 0 (there is none otherwise)")
    if not 2 <= items <= 10**digits // 2:
        raise ValueError(f"items must be in [2, {10**digits // 2}], got {items}")
    rng = random.Random(f"sort:{digits}:{items}:{seed}:{split}")
    rows = []
    while len(rows) < size:
        numbers = rng.sample(range(10**digits), items)
        if holdout and held_out(numbers, holdout) != (split == "test"):
            continue
        question = "Sort these numbers from smallest to largest: " + ", ".join(
            map(str, numbers)
        )
        rows.append(
            {
                "id": f"sort-{seed}-{len(rows)}",
                "question": question,
                "answer": ", ".join(map(str, sorted(numbers))),
                "messages": [{"role": "user", "content": question}],
            }
        )
    return rows


def sorted_list_reward_fn(
    prompt, completions, prompt_ids, completion_ids, answer, **kwargs
) -> float:
    """1 if the completion's last len(answer) integers are the sorted list."""
    want = [int(x) for x in _INT.findall(str(answer))]
    got = [int(x) for x in _INT.findall(completions)]
    return float(len(got) >= len(want) and got[-len(want) :] == want)
