"""areal-marlaas's vLLM general plugin: grouped multi-LoRA kernels for the CPU backend.

Runs inside the vLLM server's own venv (this folder goes on its PYTHONPATH; the
``.dist-info`` beside it registers the ``vllm.general_plugins`` entry point, which
vLLM loads in the API server, engine core and every worker process).

vLLM's CPU punica wrapper uses ``vllm.lora.ops.torch_ops``, whose ``bgmv_*`` ops
gather one full LoRA matrix *per token* (``weights[indices]``: tokens x out x rank)
and run a batched mat-vec in the activation dtype. On one core without bf16
instructions that adds 14 s to a 1,320-token 3-adapter prefill (47 s vs 33 s for
the base model), stalling every tenant at each round's start. Here each adapter in
the batch is one GEMM over its own tokens, accumulated in float32. Token index -1
(no adapter) contributes zero, as in vLLM's GPU kernels (the torch ops would
index the last slot's weights instead).
"""

from __future__ import annotations

import logging

import torch

logger = logging.getLogger("vllm.marlaas_plugin")

_PATCHED = ("bgmv_expand", "bgmv_expand_slice", "bgmv_shrink")


def lora_matmul(
    inputs: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor
) -> torch.Tensor:
    """``out[t] = inputs[t] @ weights[indices[t]].T`` in float32, one GEMM per
    adapter; rows whose index is negative are zero."""
    w = weights.squeeze(1) if weights.dim() == 4 else weights
    x = inputs.to(torch.float32)
    ids = torch.unique(indices).tolist()
    if len(ids) == 1 and ids[0] >= 0:  # the common case: one adapter per step
        return x @ w[ids[0]].to(torch.float32).T
    out = x.new_zeros(x.shape[0], w.shape[1])
    for i in ids:
        if i < 0:
            continue
        rows = (indices == i).nonzero().squeeze(1)
        out.index_copy_(0, rows, x.index_select(0, rows) @ w[i].to(torch.float32).T)
    return out


# The three ops below keep vLLM's signatures and output handling (torch_ops'
# padding/limit rules) and only replace how ``outputs`` is computed.
def bgmv_expand(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    add_inputs: bool = True,
):
    outputs = lora_matmul(inputs, lora_b_weights, lora_indices_tensor)
    outputs = outputs.to(output_tensor.dtype)
    limit = output_tensor.shape[0]
    if outputs.shape[0] == 1 and output_tensor.shape[0] != 1:
        limit = 1
    common_len = min(outputs.shape[1], output_tensor.shape[1])
    if add_inputs:
        output_tensor[:, :common_len] += outputs[:limit, :common_len]
    else:
        output_tensor[:, :common_len] = outputs[:limit, :common_len]


def bgmv_shrink(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    scaling: float = 1.0,
):
    outputs = lora_matmul(inputs, lora_b_weights, lora_indices_tensor)
    outputs = outputs.to(output_tensor.dtype)
    output_tensor[:, : outputs.shape[1]] = scaling * outputs[:]


def bgmv_expand_slice(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    slice_offset: int,
    slice_size: int,
    add_inputs: bool = True,
):
    outputs = lora_matmul(inputs, lora_b_weights, lora_indices_tensor)
    outputs = outputs.to(output_tensor.dtype)
    if add_inputs:
        output_tensor[:, slice_offset : slice_offset + slice_size] += outputs[:]
    else:
        output_tensor[:, slice_offset : slice_offset + slice_size] = outputs[:]


def register() -> None:
    """vLLM's plugin hook (called once per process, maybe more: idempotent).

    The ``sgmv_*`` (prefill) ops call ``bgmv_*`` through ``lora_ops``' globals;
    ``punica_cpu`` imported the ``bgmv_*`` names itself, so both are rebound.
    """
    import vllm.lora.ops.torch_ops as torch_ops
    from vllm.lora.ops.torch_ops import lora_ops
    from vllm.lora.punica_wrapper import punica_cpu

    ours = globals()
    for module in (lora_ops, torch_ops, punica_cpu):
        for name in _PATCHED:
            if hasattr(module, name):
                setattr(module, name, ours[name])
    logger.info("marlaas: grouped CPU multi-LoRA kernels installed")
