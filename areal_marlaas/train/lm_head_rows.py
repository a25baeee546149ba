"""The LM head computed only on the rows the GRPO loss reads.

During ``train_batch`` (and ``eval_batch``) the model's output embedding runs
on the loss mask's rows of each packed micro-batch; the logprobs, entropies and
logit stats are computed on those rows and put back at their positions. Forwards outside
``train_batch`` (``compute_logp``, the audit) keep the full head.
"""

from __future__ import annotations

import torch
from areal.utils.functional import gather_logprobs_entropy

from areal_marlaas.train.host import EngineHost


class LMHeadRows(EngineHost):
    """A training forward computes the LM head only where the loss reads it.

    The GRPO loss reads the logprob of every generated token, i.e. the logits
    of the rows under the (shifted) loss mask; the prompt's rows would be
    computed, log-softmaxed and masked away. The LM head is the largest layer of
    a small model (SmolLM2-135M: 49k x 576, ~17% of a step's FLOPs), so during
    ``train_batch`` it runs on the loss mask's rows only and returns those rows'
    logits; the logprobs and entropies are computed on them and put back at
    their positions (zero elsewhere, where the mask ignores them). Every loss
    term, logprob and gradient the update reads is the same (tested). The
    per-token logit min/max stats then describe the loss's rows.

    A mixin for AReaL's FSDP engine (before it in the MRO); the engine calls
    ``_install_row_head`` once its model is built."""

    def _row_select(self) -> bool:
        # Sequence/tensor parallelism and tree training lay the rows out
        # otherwise; they keep the full head.
        return (
            self.parallel_helper.sp_size == 1
            and self.parallel_helper.tp_size == 1
            and not self.enable_tree_training
            # A loss that shifts its mask itself (DPO) reads other rows.
            and not getattr(self, "_full_head", False)
        )

    def _install_row_head(self) -> None:
        self._lm_rows: torch.Tensor | None = None
        self._length = 0  # the micro-batch's tokens, while _lm_rows is set
        self._in_train_batch = False
        # An HF model: nn.Module's stub types its methods as Tensor | Module.
        head = self.model.get_output_embeddings()  # pyright: ignore[reportCallIssue]
        full = head.forward

        def forward(hidden: torch.Tensor) -> torch.Tensor:
            rows = self._lm_rows
            if rows is None or hidden.ndim != 3 or hidden.shape[0] != 1:
                return full(hidden)
            return full(hidden.index_select(1, rows))

        head.forward = forward

    def train_batch(self, input_, loss_fn, loss_weight_fn):
        self._in_train_batch = self._row_select()
        try:
            return super().train_batch(input_, loss_fn, loss_weight_fn)
        finally:
            self._in_train_batch = False
            self._lm_rows = None

    def eval_batch(self, input_, loss_fn, loss_weight_fn):
        # A loss over the mask's rows reads only those rows here too.
        self._in_train_batch = self._row_select()
        try:
            return super().eval_batch(input_, loss_fn, loss_weight_fn)
        finally:
            self._in_train_batch = False
            self._lm_rows = None

    def _prepare_mb_inputs(self, mb_item):
        inputs, ctx = super()._prepare_mb_inputs(mb_item)
        self._lm_rows = None
        if self._in_train_batch:
            mask = ctx.mb_input["loss_mask"].reshape(-1)
            length = inputs["input_ids"].shape[-1]
            rows = mask.nonzero().reshape(-1)
            # Padding, if any, is at the end; a micro-batch with nothing to
            # learn keeps every row (AReaL returns a zero loss over them).
            if rows.numel() and mask.numel() <= length:
                self._lm_rows = rows.to(inputs["input_ids"].device)
                self._length = length
        return inputs, ctx

    def _spread(self, values: torch.Tensor, length: int, fill=0.0) -> torch.Tensor:
        """Per-row values of the computed rows, back at their positions."""
        rows = self._lm_rows
        assert rows is not None  # callers without rows return before this
        out = values.new_full((length,), fill)
        return out.index_copy(0, rows, values)

    def _compute_logprobs_entropy(self, logits, inputs, ulysses_pad_size=0):
        rows = self._lm_rows
        if rows is None:
            return super()._compute_logprobs_entropy(logits, inputs, ulysses_pad_size)
        labels = torch.roll(inputs["input_ids"], shifts=-1, dims=-1).reshape(-1)
        logprobs, entropy = gather_logprobs_entropy(
            logits, labels[rows], temperature=self.config.temperature
        )
        hits = getattr(self, "_token_hits", None)
        if hits is not None:  # a supervised step's token accuracy
            hits.append((logits.detach().argmax(-1) == labels[rows]).sum())
        n = labels.numel()
        return self._spread(logprobs, n), self._spread(entropy, n)

    def _get_vocab_min_max_logits(self, logits, ulysses_pad_size=0):
        lo, hi = super()._get_vocab_min_max_logits(logits, ulysses_pad_size)
        rows = self._lm_rows
        if rows is None:
            return lo, hi
        # Rows not computed get the computed rows' mean, so the stat's mean,
        # min and max are those of the loss's rows.
        n = self._length
        return self._spread(lo, n, float(lo.mean())), self._spread(
            hi, n, float(hi.mean())
        )
