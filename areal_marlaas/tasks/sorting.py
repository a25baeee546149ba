"""A synthetic list task: sort a few numbers, checked exactly.

``holdout`` splits the problem space itself: a problem is its multiset of
numbers, so no held-out problem is ever a training problem in any order.
"""

from __future__ import annotations

import random
import re

from areal_marlaas.tasks.splits import check_split, in_holdout

_INT = re.compile(r"-?\d+")


def held_out(numbers: list[int], holdout: float) -> bool:
    """Whether the problem of sorting ``numbers`` (in any order) is held out."""
    return in_holdout("sort:" + ",".join(map(str, sorted(numbers))), holdout)


def items_problem(digits: int, items: int) -> str:
    """What is wrong with sorting ``items`` numbers of ``digits`` digits ("" =
    nothing): at least 2, and few enough to draw distinct ones easily."""
    most = 10**digits // 2
    if 2 <= items <= most:
        return ""
    return f"items must be in [2, {most}] for {digits}-digit numbers, got {items}."


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
    check_split(split, holdout)
    problem = items_problem(digits, items)
    if problem:
        raise ValueError(problem)
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
