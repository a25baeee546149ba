"""The supervised step on the multi-LoRA engine (CPU, one rank, a tiny model):
its loss and token accuracy against a plain Hugging Face forward, learning,
and the other tenants' state left alone."""

from __future__ import annotations

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from areal_marlaas.methods import Method
from tests.support.engines import make_engine, ragged_batch
from tests.support.snapshots import (
    assert_bitwise_equal,
    lora_snapshot,
    optimizer_snapshot,
)

pytestmark = pytest.mark.usefixtures("single_rank_env")


def examples(lens, prompt=3, seed=0, vocab=128):
    """One example per length; the tokens after the prompt repeat a short
    pattern, so a few steps can learn them."""
    b = ragged_batch(lens, seed=seed, prompt=prompt, vocab=vocab)
    out = []
    for i, n in enumerate(lens):
        ids = b["input_ids"][i : i + 1, :n].long().clone()
        ids[0, prompt:] = torch.tensor([(5 + j % 4) for j in range(n - prompt)])
        mask = torch.zeros(1, n, dtype=torch.long)
        mask[0, prompt:] = 1
        out.append(
            {
                "input_ids": ids,
                "attention_mask": torch.ones(1, n, dtype=torch.bool),
                "loss_mask": mask,
            }
        )
    return out


def hf_score(model, batch):
    """Mean NLL and token accuracy of the masked tokens, one sequence at a time."""
    nll, hits, n = 0.0, 0, 0
    with torch.no_grad():
        for ex in batch:
            ids, mask = ex["input_ids"][0], ex["loss_mask"][0].bool()
            logits = model(ids[None]).logits[0, :-1].float()
            target, m = ids[1:], mask[1:]
            logp = torch.log_softmax(logits, -1).gather(-1, target[:, None])[:, 0]
            nll += float(-logp[m].sum())
            hits += int((logits.argmax(-1)[m] == target[m]).sum())
            n += int(m.sum())
    return nll / n, hits / n


def test_the_first_step_scores_the_batch_as_the_base_model_does(tiny):
    engine = make_engine(tiny["llama"])
    engine.add_task(
        "s", lr=1e-2, total_steps=5, n_samples=1, seed=0, train_method="sft"
    )
    batch = examples([12, 7, 20])
    base = AutoModelForCausalLM.from_pretrained(tiny["llama"], dtype=torch.float32)

    out = engine.train_task("s", batch)  # B = 0: the adapter is the identity

    loss, accuracy = hf_score(base, batch)
    assert out["version"] == 1
    assert out["loss"] == pytest.approx(loss, abs=1e-5)
    assert out["supervised"]["train_mean_token_accuracy"] == pytest.approx(accuracy)
    assert out["supervised"]["trained_tokens"] == 9 + 4 + 17


def test_steps_learn_and_validation_matches_the_saved_adapter_in_stock_peft(
    tiny, tmp_path
):
    engine = make_engine(tiny["llama"])
    engine.add_task(
        "s", lr=2e-2, total_steps=10, n_samples=1, seed=0, train_method="sft"
    )
    batch = examples([12, 7, 20])
    first = engine.train_task("s", batch)["loss"]
    for _ in range(6):
        engine.train_task("s", batch)

    out = engine.train_task("s", batch, valid=batch)

    engine.save_adapter("s", tmp_path / "v8")
    base = AutoModelForCausalLM.from_pretrained(tiny["llama"], dtype=torch.float32)
    tuned = PeftModel.from_pretrained(base, str(tmp_path / "v8"))
    loss, accuracy = hf_score(tuned, batch)
    sup = out["supervised"]
    assert out["version"] == 8 and sup["valid_tokens"] == 30
    assert sup["valid_loss"] < out["loss"] < first  # learned, and the step helped
    assert sup["valid_loss"] == pytest.approx(loss, abs=1e-4)
    assert sup["valid_mean_token_accuracy"] == pytest.approx(accuracy)
    assert accuracy > 0.1  # ~0.23 here: the hits compared are not 0 == 0


def test_a_supervised_step_leaves_another_tasks_adapter_and_optimizer_alone(tiny):
    engine = make_engine(tiny["llama"])
    engine.add_task("rl", lr=1e-2, total_steps=5, n_samples=2, seed=1)
    engine.add_task(
        "s", lr=1e-2, total_steps=5, n_samples=1, seed=0, train_method="sft"
    )
    engine.switch_task("rl")
    weights, optim = lora_snapshot(engine, "rl"), optimizer_snapshot(engine, "rl")

    engine.train_task("s", examples([9, 14]))

    assert engine.slots["s"].meta["method"] is Method.SFT
    assert engine.slots["s"].version == 1 and engine.slots["rl"].version == 0
    assert_bitwise_equal(lora_snapshot(engine, "rl"), weights)
    assert_bitwise_equal(optimizer_snapshot(engine, "rl"), optim)
