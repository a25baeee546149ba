"""A task's prompts in a seeded, resumable order."""

from __future__ import annotations

import random
from typing import Any

from areal.utils.hf_utils import apply_chat_template

from areal_marlaas.agents.protocol import prompt_messages


class TaskData:
    """Epoch-wise shuffled rows; ``cursor`` (saved at every commit) says where the
    next batch starts, so a resumed task continues with the same prompts."""

    def __init__(
        self,
        rows: list[dict[str, Any]],
        seed: int,
        tokenizer=None,
        max_prompt_tokens: int | None = None,
        cursor: int = 0,
    ):
        self.rows = rows
        self.seed = seed
        self.tokenizer = tokenizer
        self.max_prompt_tokens = max_prompt_tokens
        self.cursor = cursor
        self.skipped = 0
        self._epoch_order: tuple[int, list[int]] = (-1, [])

    def _order(self, epoch: int) -> list[int]:
        if self._epoch_order[0] != epoch:
            order = list(range(len(self.rows)))
            random.Random(f"{self.seed}:{epoch}").shuffle(order)
            self._epoch_order = (epoch, order)
        return self._epoch_order[1]

    def _fits(self, row: dict[str, Any]) -> bool:
        if self.tokenizer is None or self.max_prompt_tokens is None:
            return True
        ids = apply_chat_template(
            self.tokenizer,
            prompt_messages(row),
            tokenize=True,
            add_generation_prompt=True,
        )
        return len(ids) <= self.max_prompt_tokens

    def next_batch(self, size: int) -> list[dict[str, Any]]:
        """The next ``size`` rows whose prompt fits (longer ones are skipped)."""
        batch: list[dict[str, Any]] = []
        scanned = 0
        while len(batch) < size:
            if scanned >= 2 * len(self.rows) + size:
                raise ValueError(
                    f"fewer than {size} rows have prompts within "
                    f"max_prompt_tokens={self.max_prompt_tokens}"
                )
            epoch, i = divmod(self.cursor, len(self.rows))
            row = self.rows[self._order(epoch)[i]]
            self.cursor += 1
            scanned += 1
            if self._fits(row):
                batch.append(row)
            else:
                self.skipped += 1
        return batch
