"""Preference rows for DPO: OpenAI's format, checked and tokenized.

A row is ``{"input": {"messages": [...], "tools": [...]?}, "preferred_output":
[{"role": "assistant", ...}], "non_preferred_output": [{"role": "assistant",
...}]}``. It becomes one example of two sequences (``[2, L]`` tensors, the
preferred first, right-padded), the prompt's tokens masked out: a batch of
examples concatenates to AReaL's interleaved ``[chosen_0, rejected_0, ...]``
layout that ``areal.trainer.dpo.dpo_engine.compute_dpo_loss`` reads.
"""

from __future__ import annotations

from typing import Any

import torch

from areal_marlaas.methods.sft import check_sft_row, sft_example

OUTPUTS = ("preferred_output", "non_preferred_output")


def check_dpo_row(row: object, where: str) -> None:
    """Raise ``ValueError`` naming ``where`` and the field unless ``row`` is a
    preference example."""
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
    extra = sorted(set(row) - {"input", *OUTPUTS})
    if extra:
        raise ValueError(
            f"{where}: unknown field {extra[0]!r} (a preference row has input, "
            "preferred_output and non_preferred_output)"
        )
    prompt = row.get("input")
    if not isinstance(prompt, dict) or not isinstance(prompt.get("messages"), list):
        raise ValueError(f"{where}: needs input.messages, the conversation so far")
    if not prompt["messages"] or prompt["messages"][-1].get("role") != "user":
        raise ValueError(
            f"{where}: input.messages must end with the user's turn (the prompt "
            "both outputs answer)"
        )
    for key in OUTPUTS:
        out = row.get(key)
        if out is None:
            raise ValueError(f"{where}: needs {key}, a list of one assistant message")
        if (
            not isinstance(out, list)
            or len(out) != 1
            or not isinstance(out[0], dict)
            or out[0].get("role") != "assistant"
        ):
            raise ValueError(
                f"{where}: {key} must be a list of exactly one assistant message"
            )
        check_sft_row(_conversation(row, key), f"{where} ({key})")


def _conversation(row: dict, key: str) -> dict:
    """The prompt followed by one of the outputs; only that output is trained."""
    context = [
        {**m, "weight": 0} if m.get("role") == "assistant" else m
        for m in row["input"]["messages"]
    ]
    messages = [*context, *row[key]]
    conv: dict[str, Any] = {"messages": messages}
    if row["input"].get("tools"):
        conv["tools"] = row["input"]["tools"]
    return conv


def dpo_example(
    tokenizer, row: dict, max_tokens: int, where: str = "row"
) -> dict[str, torch.Tensor]:
    """One example: ``input_ids``, ``attention_mask``, ``loss_mask`` of shape
    ``[2, L]``, the preferred sequence first."""
    seqs = [
        sft_example(tokenizer, _conversation(row, key), max_tokens, f"{where} ({key})")
        for key in OUTPUTS
    ]
    width = max(s["input_ids"].shape[1] for s in seqs)
    out = {}
    for name, dtype in (
        ("input_ids", torch.long),
        ("attention_mask", torch.bool),
        ("loss_mask", torch.long),
    ):
        t = torch.zeros(2, width, dtype=dtype)
        for i, s in enumerate(seqs):
            t[i, : s[name].shape[1]] = s[name][0]
        out[name] = t
    return out
