"""A supervised step on the multi-LoRA slot: AReaL's SFT objective
(``areal.trainer.sft.lm_engine.compute_packed_sft_loss``: the mean negative
log-likelihood of the loss mask's tokens) on the task's own demonstrations,
with the task's optimizer; and the same loss, without a step, on validation
examples.

Token accuracy is the share of trained tokens whose argmax is the label: read
from the logits of the loss's rows, which the LM head computes anyway
(``lm_head_rows``), so it costs no extra forward.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from areal.trainer.sft.lm_engine import compute_packed_sft_loss

from areal_marlaas.train.host import EngineHost


@dataclass
class TokenScore:
    """Summed over a batch's trained tokens: negative log-likelihood and hits."""

    nll: float = 0.0
    hits: int = 0
    tokens: int = 0

    @property
    def loss(self) -> float | None:
        return self.nll / self.tokens if self.tokens else None

    @property
    def accuracy(self) -> float | None:
        # hits < 0: the logits were not read (the full LM head ran).
        return self.hits / self.tokens if self.tokens and self.hits >= 0 else None


def _shifted(batch: list[dict[str, Any]]) -> list[dict[str, torch.Tensor]]:
    """Each example's loss mask moved to the position that predicts its token
    (what ``compute_packed_sft_loss`` reads, as AReaL's LMEngine does)."""
    out = []
    for ex in batch:
        ex = {k: v for k, v in ex.items() if torch.is_tensor(v)}
        ex["loss_mask"] = torch.roll(ex["loss_mask"].bool(), shifts=-1, dims=-1)
        out.append(ex)
    return out


def _weight(x: dict[str, Any]) -> torch.Tensor:
    return x["loss_mask"].count_nonzero()


class SupervisedStep(EngineHost):
    """Mixin for AReaL's FSDP engine (before it in the MRO): SFT steps and
    validation with the active task's optimizer. Needs ``LMHeadRows`` after it
    (the token hits come from the rows it computes)."""

    _token_hits: list[torch.Tensor] | None = None

    def _token_scored(self, score: TokenScore):
        def loss_fn(logprobs, entropy, input_, **kwargs):
            mask = input_["loss_mask"].bool()
            score.nll += float(-logprobs.detach().float()[mask].sum())
            score.tokens += int(mask.count_nonzero())
            return compute_packed_sft_loss(logprobs, entropy, input_, **kwargs)

        return loss_fn

    def _collect_hits(self, score: TokenScore) -> None:
        hits, self._token_hits = self._token_hits or [], None
        score.hits = int(sum(int(h.sum()) for h in hits))
        if not hits:  # the full head ran (no row selection): no accuracy
            score.hits = -1

    def supervised_update(
        self, batch: list[dict[str, Any]]
    ) -> tuple[TokenScore, dict[str, float]]:
        """One optimizer step of the active task on ``batch``; returns the
        batch's score (before the step) and AReaL's step stats (grad_norm, lr)."""
        score = TokenScore()
        self.train()
        self._token_hits = []
        try:
            stats = self.train_batch(
                _shifted(batch), self._token_scored(score), _weight
            )
        finally:
            self._collect_hits(score)
        return score, stats

    def supervised_score(self, batch: list[dict[str, Any]]) -> TokenScore:
        """The active task's loss and token accuracy on ``batch``, no step."""
        score = TokenScore()
        if not batch:
            return score
        self.eval()
        self._token_hits = []
        try:
            self.eval_batch(_shifted(batch), self._token_scored(score), _weight)
        finally:
            self._collect_hits(score)
            self.train()
        return score


def finite(value: float | None) -> bool:
    return value is None or math.isfinite(value)
