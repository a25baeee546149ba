"""Held-out scores of SFT and DPO adapters, computed apart from the trainer: a
plain Hugging Face forward (and greedy ``generate``) of the base model and of
the adapter loaded in stock PEFT, on rows no step saw.

* ``sft_scores``: the mean NLL of the held-out demonstrations' assistant
  tokens, and exact match of the greedy answer to the demonstration.
* ``preference_accuracy``: the share of held-out pairs whose preferred output
  the model gives a higher log-likelihood than the other one.

``interval`` is the 95% t-interval of a mean over seeds.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

import torch

from areal_marlaas.methods.dpo import OUTPUTS, _conversation
from areal_marlaas.methods.sft import sft_example

# Two-sided 95% t quantiles by degrees of freedom (n - 1 seeds).
_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365}


def load_model(base: str | Path, adapter: str | Path | None = None):
    """The base model in float32, with ``adapter`` (a PEFT folder) on it."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    if adapter is not None:
        model = PeftModel.from_pretrained(model, str(adapter))
    return model.eval()


def _masked_logp(model, ex: dict[str, torch.Tensor]) -> tuple[float, int]:
    """Sum of the loss mask's tokens' logprobs of one sequence, and their count."""
    ids, mask = ex["input_ids"][0], ex["loss_mask"][0].bool()
    with torch.no_grad():
        logits = model(ids[None]).logits[0, :-1].float()
    logp = torch.log_softmax(logits, -1).gather(-1, ids[1:, None])[:, 0]
    return float(logp[mask[1:]].sum()), int(mask[1:].sum())


def greedy(model, tokenizer, messages: list[dict], max_new_tokens: int = 32) -> str:
    """The model's greedy answer to ``messages``."""
    prompt = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt"
    )
    ids = prompt if torch.is_tensor(prompt) else prompt["input_ids"]
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
        )
    return tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True).strip()


def sft_scores(
    model, tokenizer, rows: list[dict[str, Any]], max_new_tokens: int = 32
) -> dict[str, float]:
    """Held-out loss (mean NLL per assistant token) and greedy exact match."""
    nll, tokens, hits = 0.0, 0, 0
    for row in rows:
        logp, n = _masked_logp(model, sft_example(tokenizer, row, 10**6))
        nll, tokens = nll - logp, tokens + n
        text = greedy(model, tokenizer, row["messages"][:-1], max_new_tokens)
        hits += text == row["messages"][-1]["content"].strip()
    return {"loss": nll / max(tokens, 1), "exact_match": hits / max(len(rows), 1)}


def preference_accuracy(model, tokenizer, rows: list[dict[str, Any]]) -> float:
    """Share of pairs whose preferred output is the likelier one."""
    right = 0
    for row in rows:
        logps = [
            _masked_logp(model, sft_example(tokenizer, _conversation(row, k), 10**6))[0]
            for k in OUTPUTS
        ]
        right += logps[0] > logps[1]
    return right / max(len(rows), 1)


def interval(values: list[float]) -> dict[str, float]:
    """Mean, sd and the 95% t-interval of the mean (``lo``, ``hi``)."""
    n = len(values)
    mean = statistics.fmean(values)
    sd = statistics.stdev(values) if n > 1 else 0.0
    half = _T95.get(n - 1, 1.96) * sd / math.sqrt(n) if n > 1 else math.inf
    return {"n": n, "mean": mean, "sd": sd, "lo": mean - half, "hi": mean + half}
