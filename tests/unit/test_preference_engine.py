"""The DPO step on the multi-LoRA engine (CPU, one rank, a tiny model): its
preference loss, accuracy and margins against a plain Hugging Face forward of
the policy (stock PEFT) and the reference, learning, and the reference being
the adapter a task started from."""

from __future__ import annotations

import math

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from tests.support.engines import make_engine

pytestmark = pytest.mark.usefixtures("single_rank_env")
BETA = 0.5


def pair(prompt, chosen, rejected):
    """One example: [2, L] tensors, the preferred sequence first."""
    seqs = [prompt + chosen, prompt + rejected]
    width = max(len(s) for s in seqs)
    ids = torch.zeros(2, width, dtype=torch.long)
    attn = torch.zeros(2, width, dtype=torch.bool)
    mask = torch.zeros(2, width, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        attn[i, : len(s)] = True
        mask[i, len(prompt) : len(s)] = 1
    return {"input_ids": ids, "attention_mask": attn, "loss_mask": mask}


BATCH = [
    pair([3, 9, 4], [5, 6, 7, 8], [20, 21, 22]),
    pair([11, 4], [5, 6, 7], [30, 31, 32, 33, 34]),
    pair([7, 7, 2, 9], [5, 6], [40, 41]),
]


def seq_logp(model, ids, mask):
    """Sum of the masked tokens' logprobs of one sequence."""
    with torch.no_grad():
        logits = model(ids[None]).logits[0, :-1].float()
    logp = torch.log_softmax(logits, -1).gather(-1, ids[1:, None])[:, 0]
    return float(logp[mask[1:].bool()].sum())


def hf_pairs(policy, reference, batch):
    """Loss, accuracy and margin of each pair, one sequence at a time."""
    out = []
    for ex in batch:
        lp = []
        for model in (policy, reference):
            for i in range(2):
                n = int(ex["attention_mask"][i].sum())
                lp.append(
                    seq_logp(model, ex["input_ids"][i, :n], ex["loss_mask"][i, :n])
                )
        margin = BETA * ((lp[0] - lp[2]) - (lp[1] - lp[3]))
        out.append((-math.log(1 / (1 + math.exp(-margin))), margin > 0, margin))
    return out


def test_the_first_step_starts_at_the_reference_and_steps_learn_the_preference(tiny):
    engine = make_engine(tiny["llama"])
    engine.add_task(
        "p", lr=2e-2, total_steps=8, n_samples=1, seed=0, train_method="dpo", beta=BETA
    )

    first = engine.train_task("p", BATCH)
    for _ in range(5):
        out = engine.train_task("p", BATCH)

    # v0 is the reference (B = 0: the base), so every margin starts at 0.
    assert first["loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert first["preference"]["train_reward_margin"] == pytest.approx(0, abs=1e-6)
    assert out["version"] == 6 and out["preference"]["trained_pairs"] == 3
    assert out["loss"] < first["loss"]
    assert out["preference"]["train_preference_accuracy"] == 1.0


def test_validation_matches_stock_peft_against_the_base_model(tiny, tmp_path):
    engine = make_engine(tiny["llama"])
    engine.add_task(
        "p", lr=2e-2, total_steps=8, n_samples=1, seed=0, train_method="dpo", beta=BETA
    )
    for _ in range(3):
        engine.train_task("p", BATCH[:2])

    out = engine.train_task("p", BATCH[:2], valid=BATCH)

    engine.save_adapter("p", tmp_path / "v4")
    base = AutoModelForCausalLM.from_pretrained(tiny["llama"], dtype=torch.float32)
    policy = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny["llama"], dtype=torch.float32),
        str(tmp_path / "v4"),
    )
    ref = hf_pairs(policy, base, BATCH)
    pref = out["preference"]
    assert pref["valid_pairs"] == 3
    assert pref["valid_loss"] == pytest.approx(sum(r[0] for r in ref) / 3, abs=1e-4)
    assert pref["valid_reward_margin"] == pytest.approx(
        sum(r[2] for r in ref) / 3, abs=1e-4
    )
    assert pref["valid_preference_accuracy"] == pytest.approx(
        sum(r[1] for r in ref) / 3
    )
    assert any(abs(r[2]) > 1e-3 for r in ref)  # the margins compared are not all 0


def test_the_reference_is_the_adapter_a_task_started_from(tiny, tmp_path):
    engine = make_engine(tiny["llama"])
    engine.add_task(
        "sft", lr=5e-2, total_steps=3, n_samples=1, seed=0, train_method="sft"
    )
    seqs = [{k: v[:1] for k, v in ex.items()} for ex in BATCH]
    for _ in range(2):
        engine.train_task("sft", seqs)
    engine.save_adapter("sft", tmp_path / "ft")

    engine.add_task(
        "p",
        lr=2e-2,
        total_steps=3,
        n_samples=1,
        seed=0,
        train_method="dpo",
        beta=BETA,
        init_adapter=tmp_path / "ft",
        reference_adapter=tmp_path / "ft",
    )
    out = engine.train_task("p", BATCH)

    # It starts from the reference: margins 0, though the adapter is not the base.
    assert out["loss"] == pytest.approx(math.log(2), abs=1e-6)
    base = AutoModelForCausalLM.from_pretrained(tiny["llama"], dtype=torch.float32)
    ft = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny["llama"], dtype=torch.float32),
        str(tmp_path / "ft"),
    )
    assert any(abs(r[2]) > 1e-3 for r in hf_pairs(ft, base, BATCH))
