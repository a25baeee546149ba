"""areal-marlaas's vLLM general plugin for the CPU backend: grouped multi-LoRA
kernels, and seeded sampling that survives chunked prefill.

Runs inside the vLLM server's own venv (this folder goes on its PYTHONPATH; the
``.dist-info`` beside it registers the ``vllm.general_plugins`` entry point, which
vLLM loads in the API server, engine core and every worker process).

vLLM's CPU punica wrapper uses ``vllm.lora.ops.torch_ops``, whose ``bgmv_*`` ops
gather one full LoRA matrix *per token* (``weights[indices]``: tokens x out x rank)
and run a batched mat-vec in the activation dtype, which makes a multi-adapter
prefill far slower than the base model's (docs/cpu_serving.md has the measured
numbers and their machine), stalling every tenant at each round's start. Here
each adapter in the batch is one GEMM over its own tokens, accumulated in
float32. Token index -1 (no adapter) contributes zero, as in vLLM's GPU kernels
(the torch ops would index the last slot's weights instead).
``MARLAAS_GROUPED_LORA=0`` keeps vLLM's ops.

Seeded requests (vLLM 0.32): when a step only prefills part of a seeded prompt,
the runner discards that step's sample and rewinds the request's generator with
``get_offset``/``set_offset``, which CPU generators do not have; the engine core
dies ("CPU Generator does not use offset"). Here the sampler snapshots each
seeded generator before it draws, and a discarded request gets that snapshot
back instead of the rewind: the draw is undone, as the rewind does on GPU.
"""

from __future__ import annotations

import functools
import logging
import os

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


# Each seeded CPU generator's state before this step's draw, by id (this step's
# requests only, so finished requests' generators are not kept).
_PRE_DRAW: dict[int, torch.Tensor] = {}


def _snapshot_generators(forward):
    @functools.wraps(forward)
    def forward_with_snapshot(self, logits, sampling_metadata, *args, **kwargs):
        global _PRE_DRAW
        _PRE_DRAW = {
            id(g): g.get_state()
            for g in sampling_metadata.generators.values()
            if g.device.type == "cpu"
        }
        return forward(self, logits, sampling_metadata, *args, **kwargs)

    forward_with_snapshot._marlaas = True
    return forward_with_snapshot


def _undo_discarded_draws(bookkeeping):
    @functools.wraps(bookkeeping)
    def bookkeeping_without_offsets(self, *args, **kwargs):
        gens = self.input_batch.generators
        held = {}
        if gens:
            n = self.input_batch.num_reqs
            for i in self.discard_request_mask.np[:n].nonzero()[0].tolist():
                g = gens.get(i)
                if g is None or g.device.type != "cpu":
                    continue
                if id(g) in _PRE_DRAW:
                    g.set_state(_PRE_DRAW[id(g)])
                # Hidden from the offset rewind, which CPU generators lack.
                held[i] = gens.pop(i)
        try:
            return bookkeeping(self, *args, **kwargs)
        finally:
            gens.update(held)

    bookkeeping_without_offsets._marlaas = True
    return bookkeeping_without_offsets


def install_seeded_sampling_fix() -> None:
    from vllm.v1.sample.sampler import Sampler
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    if not getattr(Sampler.forward, "_marlaas", False):
        Sampler.forward = _snapshot_generators(Sampler.forward)
    if not getattr(GPUModelRunner._bookkeeping_sync, "_marlaas", False):
        GPUModelRunner._bookkeeping_sync = _undo_discarded_draws(
            GPUModelRunner._bookkeeping_sync
        )
    logger.info("marlaas: seeded sampling survives chunked prefill on CPU")


def register() -> None:
    """vLLM's plugin hook (called once per process, maybe more: idempotent)."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    install_seeded_sampling_fix()
    if os.environ.get("MARLAAS_GROUPED_LORA", "1") != "0":
        install_grouped_lora()


def install_grouped_lora() -> None:
    """The ``sgmv_*`` (prefill) ops call ``bgmv_*`` through ``lora_ops``' globals;
    ``punica_cpu`` imported the ``bgmv_*`` names itself, so both are rebound."""
    import vllm.lora.ops.torch_ops as torch_ops
    from vllm.lora.ops.torch_ops import lora_ops
    from vllm.lora.punica_wrapper import punica_cpu

    ours = globals()
    for module in (lora_ops, torch_ops, punica_cpu):
        for name in _PATCHED:
            if hasattr(module, name):
                setattr(module, name, ours[name])
    logger.info("marlaas: grouped CPU multi-LoRA kernels installed")
