"""The multi-LoRA FSDP engine on one CPU rank over a tiny model, and batches
shaped as rollouts produce them."""

from __future__ import annotations

import torch
from areal.api.cli_args import OptimizerConfig, PPOActorConfig
from areal.api.io_struct import FinetuneSpec

from areal_marlaas.train.engine import MultiLoRAFSDPPPOActor


def make_engine(path, cls=MultiLoRAFSDPPPOActor, **overrides):
    # MARLaaS's actor defaults: one optimizer step per batch, no reference model.
    overrides = {
        "ppo_n_minibatches": 1,
        "kl_ctl": 0.0,
        "attn_impl": "sdpa",
        **overrides,
    }
    cfg = PPOActorConfig(
        experiment_name="test",
        trial_name="engine",
        path=str(path),
        backend="fsdp:d1",
        dtype="float32",
        use_lora=True,
        lora_rank=8,
        lora_alpha=16,
        target_modules=["all-linear"],
        optimizer=OptimizerConfig(lr=1e-3),
        **overrides,
    )
    engine = cls(cfg)
    engine.create_process_group()
    engine.initialize(None, FinetuneSpec(1, 100, 2))
    return engine


def ragged_batch(lens, vocab=128, seed=0, version=0, prompt=3):
    """Right-padded sequences of different lengths, as rollouts produce them."""
    g = torch.Generator().manual_seed(seed)
    n, width = len(lens), max(lens)
    ids = torch.zeros(n, width, dtype=torch.int32)
    attn = torch.zeros(n, width, dtype=torch.bool)
    for i, length in enumerate(lens):
        ids[i, :length] = torch.randint(3, vocab, (length,), generator=g)
        attn[i, :length] = True
    loss = attn.int().clone()
    loss[:, :prompt] = 0
    return {
        "input_ids": ids,
        "attention_mask": attn,
        "loss_mask": loss,
        "logprobs": -torch.rand(n, width, generator=g) * loss,
        "versions": torch.where(loss.bool(), version, -1).int(),
        "rewards": torch.tensor([float(i % 2) for i in range(n)]),
        "task": "any",
    }
