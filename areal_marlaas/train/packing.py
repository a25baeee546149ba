"""Packed micro-batches on a CPU: the attention-mask fix and the unpadded pack.

AReaL packs a micro-batch's sequences into one row and passes
``{"full_attention": None, ...}`` as its attention mask, which only varlen flash
attention reads correctly: with sdpa/eager it crashes on Llama and, on Qwen3,
attends across sequence boundaries. ``PackedAttentionMaskFix`` drops that mask
(transformers then builds a block-diagonal causal mask from the per-sequence
position_ids) and, on a CPU-only machine with ``attn_impl=sdpa``, runs
``marlaas_packed`` attention (``train/attention.py``) on packs without AReaL's
GPU page padding. ``eager_on_cpu`` keeps AReaL's compiled helpers eager there.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from areal_marlaas.train.attention import PACKED
from areal_marlaas.train.host import EngineHost

# Attention implementations that take packed sequences through cu_seqlens; the rest
# (sdpa, eager) need a real mask, which transformers builds from position_ids.
_VARLEN_ATTN = ("flash_attention_2", "flash_attention_3", "kernels-community")


def eager_on_cpu() -> bool:
    """Run AReaL's torch.compile'd helpers (the chunked logprob gather) eagerly on
    a CPU-only machine: inductor's C++ compile of them costs ~30 s in every new
    process (measured on a 2-core Xeon: first step 46 s vs 16 s) and buys no
    measurable speed there (13-14 s per step either way). Set
    TORCHDYNAMO_DISABLE=0 to keep compiling."""
    if torch.cuda.is_available() or os.environ.get("TORCHDYNAMO_DISABLE") == "0":
        return False
    from torch import _dynamo

    _dynamo.config.disable = True
    return True


def _strip_padding(mb: dict[str, Any], pad: int) -> dict[str, Any]:
    """A padded, unsqueezed micro-batch ([1, L] tensors; the padding is one extra
    sequence at the end of ``cu_seqlens``) without its padding."""
    if not pad:
        return mb
    length = int(mb["cu_seqlens"][-1])
    cu = mb["cu_seqlens"][:-1]
    longest = int((cu[1:] - cu[:-1]).max())
    out = {}
    for key, value in mb.items():
        if key in ("cu_seqlens", "cu_seq_lens_q", "cu_seq_lens_k"):
            out[key] = cu
        elif key in ("max_seqlen", "max_length_q", "max_length_k"):
            out[key] = longest
        elif torch.is_tensor(value) and value.ndim >= 2 and value.shape[1] == length:
            out[key] = value[:, : length - pad]
        else:
            out[key] = value
    return out


class PackedAttentionMaskFix(EngineHost):
    """Mixin for AReaL's FSDP engine (before it in the MRO): packed micro-batches
    that sdpa/eager attention read correctly.

    With ``attn_impl=sdpa`` on a CPU-only machine the model runs
    ``marlaas_packed`` attention: per-sequence causal sdpa, no mask over the
    whole pack, no page padding. Elsewhere (a GPU, eager) transformers builds
    the block-diagonal mask from position_ids."""

    def _packed(self) -> bool:
        return self.config.attn_impl == "sdpa" and not torch.cuda.is_available()

    def _use_packed_attention(self) -> None:
        if self._packed():
            # An HF model: nn.Module's stub types its attributes as Tensor | Module.
            self.model.config._attn_implementation = PACKED  # pyright: ignore[reportAttributeAccessIssue, reportArgumentType]

    def _prepare_mb_list(self, input_: dict[str, Any]):
        mb_list = super()._prepare_mb_list(input_)
        if self.config.attn_impl not in _VARLEN_ATTN:
            for mb in [*mb_list.mbs, *(mb_list.padded_mbs or [])]:
                if isinstance(mb.get("attention_mask"), dict):
                    mb["attention_mask"] = None
        if self._packed() and mb_list.padded_mbs is not None:
            # AReaL pads each micro-batch to a multiple of 256 tokens (a GPU page):
            # on a CPU that is only extra work (582 tokens -> 768).
            assert mb_list.padding_lengths is not None  # set with padded_mbs
            mb_list.padded_mbs = [
                _strip_padding(mb, pad)
                for mb, pad in zip(
                    mb_list.padded_mbs, mb_list.padding_lengths, strict=True
                )
            ]
            mb_list.padding_lengths = [0] * len(mb_list.mbs)
            mb_list.padded_to_lengths = list(mb_list.group_lens)
        return mb_list
