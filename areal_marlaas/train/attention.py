"""Attention over packed sequences, one sequence at a time, for CPUs.

AReaL packs a micro-batch's sequences into one row. With ``sdpa`` the model then
gets one block-diagonal causal mask over the whole pack: every layer computes
(and masks away) attention between all pairs of the pack's tokens, a cost that
grows with the square of the pack (16 sequences of 80 tokens: 16x the attention
work of the sequences alone), and builds the mask first. Flash-attention's varlen
kernels avoid that on GPUs; ``marlaas_packed`` does it with plain
``scaled_dot_product_attention``: causal attention within each sequence, the
boundaries read from the ``cu_seq_lens_q`` AReaL passes with every packed
micro-batch. Same math per sequence, so the same logprobs and gradients up to
float summation order (tested).
"""

from __future__ import annotations

from itertools import pairwise

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

PACKED = "marlaas_packed"


def packed_sdpa_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    cu = kwargs.get("cu_seq_lens_q")
    if cu is None or query.shape[0] != 1 or attention_mask is not None:
        # Not a packed row (generation, a plain batch): transformers' sdpa.
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout, scaling, is_causal
        )
    bounds = cu.tolist()
    sizes = [e - s for s, e in pairwise(bounds)]
    gqa = query.shape[1] != key.shape[1]
    # torch.split, not q[:, :, s:e]: each slice's backward allocates and fills a
    # zero gradient of the whole pack (16 sequences x 30 layers x q/k/v of them
    # per step); split's backward is one concatenation.
    outs = [
        F.scaled_dot_product_attention(
            q, k, v, dropout_p=dropout, scale=scaling, is_causal=True, enable_gqa=gqa
        )
        for q, k, v in zip(
            query.split(sizes, dim=2),
            key.split(sizes, dim=2),
            value.split(sizes, dim=2),
            strict=True,
        )
        if q.shape[2]
    ]
    return torch.cat(outs, dim=2).transpose(1, 2).contiguous(), None


# No mask function is registered for it: transformers then builds no mask.
AttentionInterface.register(PACKED, packed_sdpa_forward)
