"""The rows of a method that trains on its own examples (SFT demonstrations,
DPO preference pairs): checked and tokenized by the method's rules."""

from __future__ import annotations

from typing import Any

import torch

from areal_marlaas.methods import Method
from areal_marlaas.methods.dpo import check_dpo_row, dpo_example
from areal_marlaas.methods.sft import check_sft_row, sft_example

_RULES = {
    Method.SFT: (check_sft_row, sft_example),
    Method.DPO: (check_dpo_row, dpo_example),
}


def check_row(method: Method, row: object, where: str) -> None:
    """Raise ``ValueError`` naming ``where`` and the field unless ``row`` is an
    example of ``method``."""
    _RULES[method][0](row, where)


def example(
    method: Method, tokenizer, row: dict, max_tokens: int, where: str
) -> dict[str, torch.Tensor]:
    """``row`` checked and tokenized (``ValueError`` past ``max_tokens``)."""
    check, tokenize = _RULES[method]
    check(row, where)
    return tokenize(tokenizer, row, max_tokens, where)


def load_examples(
    method: Method, tokenizer, path: str, split: str, size: int, max_tokens: int
) -> list[dict[str, torch.Tensor]]:
    """A dataset's examples (``size`` > 0: its first ``size`` rows); raises
    ``ValueError`` naming the first bad line."""
    from areal_marlaas.tasks.records import read_records

    rows: list[Any] = read_records(path, split)
    if size:
        rows = rows[:size]
    if not rows:
        raise ValueError(f"{path}: no examples")
    return [
        example(method, tokenizer, row, max_tokens, f"{path}:{n}")
        for n, row in enumerate(rows, 1)
    ]
