"""PEFT LoRA adapters on disk: the format both vLLM and AReaL's FSDP engine read.

Only LoRA parameters are written (``adapter_model.safetensors`` +
``adapter_config.json``), never the base model.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from areal.utils import logging

logger = logging.getLogger("MARLaaSAdapters")


def adapter_name(task: str, version: int) -> str:
    """The served model name of a task version (AReaL's ``get_versioned_lora_name``)."""
    return f"{task}-v{version}"


# vLLM's --max-lora-rank accepts only these values.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def lora_config(rank: int, alpha: int, target_modules: list[str]):
    from peft import LoraConfig, TaskType

    targets = list(target_modules or ["all-linear"])
    return LoraConfig(
        task_type=TaskType.CAUSAL_LM,
        r=rank,
        lora_alpha=alpha,
        # AReaL's FSDP engine builds its adapter the same way (_apply_peft_wrapper).
        target_modules="all-linear" if targets == ["all-linear"] else targets,
        bias="none",
    )


def init_lora_adapter(
    base_model: str | Path,
    out_dir: str | Path,
    rank: int = 8,
    alpha: int = 16,
    target_modules: list[str] | None = None,
    seed: int = 0,
    b_init_std: float = 0.0,
) -> Path:
    """Write a fresh adapter for ``base_model`` into ``out_dir``.

    With ``b_init_std=0`` (PEFT's default B=0) the adapter equals the base model,
    which is every task's version 0. A positive value draws B from N(0, std) so that
    different seeds give adapters with visibly different outputs (tests, demos).
    """
    import torch
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    out_dir = Path(out_dir)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(str(base_model), dtype=torch.float32)
    peft_model = get_peft_model(model, lora_config(rank, alpha, target_modules or []))
    if b_init_std > 0:
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, param in peft_model.named_parameters():
                if "lora_B" in name:
                    param.copy_(torch.randn(param.shape, generator=gen) * b_init_std)
    tmp = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    peft_model.save_pretrained(str(tmp))
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    return out_dir
