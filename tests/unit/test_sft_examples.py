"""Supervised rows: the checks that name the field, and the tokenized example
whose loss mask covers exactly the trained assistant turns."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from areal_marlaas.methods.sft import check_sft_row, sft_example


@pytest.fixture(scope="module")
def tokenizer(model_path):
    return AutoTokenizer.from_pretrained(model_path)


def convo(*turns, **extra):
    roles = ["user", "assistant"]
    return {
        "messages": [{"role": roles[i % 2], "content": c} for i, c in enumerate(turns)]
    } | extra


def test_the_loss_mask_covers_each_trained_assistant_turn_and_its_end_token(
    tokenizer,
):
    row = convo("2+2?", "4", "and 3+3?", "6")

    ex = sft_example(tokenizer, row, 512)

    ids, mask = ex["input_ids"][0].tolist(), ex["loss_mask"][0].tolist()
    trained = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])
    assert trained == "4<|im_end|>\n6<|im_end|>\n"
    assert tokenizer.decode(ids) == tokenizer.apply_chat_template(
        row["messages"], tokenize=False
    )


def test_an_assistant_turn_of_weight_0_is_context_not_trained(tokenizer):
    row = convo("2+2?", "5", "wrong, again?", "4")
    row["messages"][1]["weight"] = 0

    ex = sft_example(tokenizer, row, 512)

    ids, mask = ex["input_ids"][0].tolist(), ex["loss_mask"][0].tolist()
    assert tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m]) == (
        "4<|im_end|>\n"
    )


def test_an_example_over_the_limit_is_refused_with_its_length(tokenizer):
    with pytest.raises(ValueError, match=r"train.jsonl:3: \d+ tokens, over .* 16"):
        sft_example(tokenizer, convo("x " * 40, "y"), 16, "train.jsonl:3")


@pytest.mark.parametrize(
    ("row", "field"),
    [
        (convo("hi"), "the last message must be the assistant's"),
        (convo("hi", "ok", "more?"), "the last message must be the assistant's"),
        ({"messages": [{"role": "", "content": "x"}]}, r"messages\[0\].role"),
        ({"messages": [{"role": "robot", "content": "x"}]}, r"messages\[0\].role"),
        ({"messages": []}, "non-empty 'messages'"),
        (convo("hi", 3), r"messages\[1\].content"),
        (
            {"messages": [{"role": "user", "content": "a", "weight": 1}]},
            r"messages\[0\].weight is allowed on assistant",
        ),
        (
            {"messages": [{"role": "assistant", "content": "a", "weight": 2}]},
            r"messages\[0\].weight must be 0 or 1",
        ),
        (
            {"messages": [{"role": "assistant", "content": "a", "weight": 0}]},
            "nothing to learn",
        ),
    ],
)
def test_a_bad_row_is_refused_naming_the_field(row, field):
    with pytest.raises(ValueError, match=field):
        check_sft_row(row, "f.jsonl:1")
