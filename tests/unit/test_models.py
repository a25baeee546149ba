"""Model preparation: the default model's tokenizer and tiny test models."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def test_default_model_tokenizer_round_trips_text(model_path):
    tok = AutoTokenizer.from_pretrained(model_path)
    text = "What is 37 plus 48?\nThe answer is 85."

    ids = tok(text)["input_ids"]

    assert tok.decode(ids) == text
    assert tok.unk_token_id not in ids  # spaces must not map to <|endoftext|>
    # SmolLM2 splits numbers into single digits.
    assert [tok.decode([i]) for i in tok("1234")["input_ids"]] == ["1", "2", "3", "4"]
    assert tok.eos_token == "<|im_end|>"
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert chat.endswith("<|im_start|>assistant\n") and "SmolLM" in chat


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_tiny_model_loads_and_runs(tmp_path, arch):
    from areal_marlaas.model_prep import make_tiny_model

    path = make_tiny_model(tmp_path / arch, arch=arch, seed=1)
    model = AutoModelForCausalLM.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)

    ids = tok("what is 12 plus 3 ?", return_tensors="pt")["input_ids"]
    logits = model(ids).logits

    assert model.config.model_type == arch
    assert logits.shape == (1, ids.shape[1], model.config.vocab_size)
    assert torch.isfinite(logits).all()
