"""A DPO step on the multi-LoRA slot: AReaL's preference objective
(``areal.trainer.dpo.dpo_engine.compute_dpo_loss``, sigmoid loss) on the task's
preference pairs, with the task's optimizer; the reference model is the task's
starting adapter (the base model for a fresh adapter), whose logprobs are
computed in the same slot before the step.

Each example is a pair, ``[2, L]`` tensors (preferred first), so a batch
concatenates to the interleaved layout the loss reads; micro-batches keep the
two sequences of a pair together (AReaL's ``mb_spec.granularity = 2``, as its
DPO engine sets). The LM head runs on every row here (the loss shifts the mask
itself, so the row selection of ``lm_head_rows`` would pick the wrong rows).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from areal.trainer.dpo.dpo_engine import _dpo_valid_pairs, compute_dpo_loss
from areal.utils.functional import dpo_pair_logratios

from areal_marlaas.train.host import EngineHost


@dataclass
class PairScore:
    """Summed over a batch's pairs: the preference loss, pairs whose implicit
    reward ranks the preferred output first, and the reward margins."""

    loss: float = 0.0
    correct: int = 0
    margin: float = 0.0
    pairs: int = 0

    def mean(self, total: float) -> float | None:
        return total / self.pairs if self.pairs else None


def _weight(x: dict[str, Any]) -> torch.Tensor:
    return _dpo_valid_pairs(x).count_nonzero().float()


class PreferenceStep(EngineHost):
    """Mixin for AReaL's FSDP engine (before it in the MRO): DPO steps and
    validation with the active task's optimizer and reference weights."""

    _full_head: bool = False  # read by LMHeadRows._row_select

    def _pair_scored(self, score: PairScore, beta: float):
        def loss_fn(logprobs, entropy, input_, **kwargs):
            valid = _dpo_valid_pairs(input_)
            if valid.any():
                policy, ref, _ = dpo_pair_logratios(
                    logprobs.detach(),
                    input_["ref_logprobs"],
                    input_["cu_seqlens"].long(),
                    input_["loss_mask"].bool(),
                    valid,
                )
                margin = (
                    beta
                    * ((policy[:, 0] - ref[:, 0]) - (policy[:, 1] - ref[:, 1])).float()
                )
                score.pairs += int(margin.numel())
                score.correct += int((margin > 0).sum())
                score.margin += float(margin.sum())
                score.loss += float(-torch.nn.functional.logsigmoid(margin).sum())
            return compute_dpo_loss(logprobs, entropy, input_, beta=beta, **kwargs)

        return loss_fn

    def _with_reference(
        self, reference: dict[str, torch.Tensor], data: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """``data`` with ``ref_logprobs``: the reference weights' logprobs,
        computed in the slot, which gets the task's weights back after."""
        from areal_marlaas.train.multilora import _local

        lora = self._lora  # pyright: ignore[reportAttributeAccessIssue]  # MultiLoRASlots
        with torch.no_grad():
            mine = {n: _local(p).detach().clone() for n, p in lora.items()}
            for n, p in lora.items():
                _local(p).copy_(reference[n])
        try:
            logps = self.compute_logp(data)
        finally:
            with torch.no_grad():
                for n, p in lora.items():
                    _local(p).copy_(mine[n])
        assert logps is not None  # the FSDP actor returns them on every rank
        return [{**ex, "ref_logprobs": lp} for ex, lp in zip(data, logps, strict=True)]

    def _pairs(self, run):
        mb = self.config.mb_spec
        granularity, mb.granularity = mb.granularity, 2
        self._full_head = True
        try:
            return run()
        finally:
            mb.granularity = granularity
            self._full_head = False

    def preference_update(
        self,
        batch: list[dict[str, Any]],
        reference: dict[str, torch.Tensor],
        beta: float,
    ) -> tuple[PairScore, dict[str, float]]:
        """One optimizer step of the active task on ``batch`` (pairs); returns
        the batch's score (before the step) and AReaL's step stats."""
        data = [{k: v for k, v in ex.items() if torch.is_tensor(v)} for ex in batch]
        score = PairScore()

        def run():
            pairs = self._with_reference(reference, data)
            self.train()
            return self.train_batch(pairs, self._pair_scored(score, beta), _weight)

        return score, self._pairs(run)

    def preference_score(
        self,
        batch: list[dict[str, Any]],
        reference: dict[str, torch.Tensor],
        beta: float,
    ) -> PairScore:
        """The active task's preference loss and accuracy on ``batch``, no step."""
        score = PairScore()
        if not batch:
            return score
        data = [{k: v for k, v in ex.items() if torch.is_tensor(v)} for ex in batch]

        def run():
            pairs = self._with_reference(reference, data)
            self.eval()
            try:
                self.eval_batch(pairs, self._pair_scored(score, beta), _weight)
            finally:
                self.train()

        self._pairs(run)
        return score
