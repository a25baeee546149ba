"""Final-answer extraction and the numeric reward; task datasets."""

from __future__ import annotations

import json
from fractions import Fraction

import pytest

from areal_marlaas.tasks.arithmetic import make_arithmetic_rows
from areal_marlaas.tasks.gsm8k import load_gsm8k_rows
from areal_marlaas.tasks.rewards import extract_final_answer, numeric_answer_reward_fn
from tests.support.paths import SHARED_DATA


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("So the answer is 42.", 42),
        ("Total: 1,200 apples", 1200),
        ("She pays $1,234.50 in all.", Fraction("1234.5")),
        ("It costs 18 dollars.\n#### 18", 18),
        ("#### -7", -7),
        ("First 3, then \\boxed{\\frac{3}{4}} and 9 more", Fraction(3, 4)),
        ("\\boxed{1{,}000}", 1000),
        ("The final answer: 75%", 75),
        ("answer is 12 meters. Let me recheck: 5 + 7 = 12", 12),
        ("3 times 4 is 12, and the answer is 12", 12),
        ("no number here", None),
    ],
)
def test_extract_final_answer_handles_common_formats(completion, expected):
    assert extract_final_answer(completion) == expected


@pytest.mark.parametrize(
    "completion, answer, reward",
    [
        ("The answer is 1,200.", "Natalia sold ... #### 1200", 1.0),
        ("#### 1200.00", "#### 1,200", 1.0),
        ("The answer is 1201.", "#### 1200", 0.0),
        ("37 + 48 = 85", "85", 1.0),
        ("I cannot tell", "85", 0.0),
        ("\\boxed{142}", 142.0, 1.0),
    ],
)
def test_numeric_reward_compares_final_numbers(completion, answer, reward):
    assert (
        numeric_answer_reward_fn("prompt", completion, [], [], answer=answer) == reward
    )


def test_arithmetic_rows_are_seeded_and_correct():
    a = make_arithmetic_rows("multiplication", 50, 2, seed=4)
    b = make_arithmetic_rows("multiplication", 50, 2, seed=4)
    c = make_arithmetic_rows("multiplication", 50, 2, seed=5)

    assert a == b and a != c
    for row in a:
        x, _, y = row["expr"].split()
        assert int(row["answer"]) == int(x) * int(y)
        assert 10 <= int(x) <= 99 and row["messages"][0]["content"] == row["question"]


def test_gsm8k_rows_from_generated_jsonl(tmp_path):
    path = tmp_path / "train.jsonl"
    recs = [{"question": "2 + 2?", "answer": "2+2=<<2+2=4>>4\n#### 4"}] * 3
    path.write_text("\n".join(json.dumps(r) for r in recs))

    from_file = load_gsm8k_rows(str(path), "train")
    from_folder = load_gsm8k_rows(str(tmp_path), "train")

    assert from_file == from_folder and len(from_file) == 3
    assert from_file[0]["messages"][0]["content"].startswith("2 + 2?")
    reward = numeric_answer_reward_fn("", "so 4", answer=from_file[0]["answer"])
    assert reward == 1.0


def test_gsm8k_corrupt_line_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"question": "q", "answer": "#### 1"}\n{not json\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        load_gsm8k_rows(str(path), "train")


@pytest.mark.skipif(
    not (SHARED_DATA / "gsm8k" / "test.jsonl").exists(), reason="shared data absent"
)
def test_gsm8k_reference_answers_score_themselves_on_real_data():
    rows = load_gsm8k_rows(str(SHARED_DATA / "gsm8k"), "test")

    assert len(rows) == 1319
    # A solution's own text must earn full reward (commas, negatives included).
    scores = [
        numeric_answer_reward_fn("", r["answer"], answer=r["answer"]) for r in rows
    ]
    assert sum(scores) == len(rows)


def test_held_out_arithmetic_is_disjoint_by_problem_whatever_the_seeds():
    """Train and test splits share no problem (nor a mirrored one), for any pair
    of seeds: the split is a property of the problem, not of the draw."""
    from areal_marlaas.tasks.arithmetic import held_out

    def problems(rows):
        out = set()
        for r in rows:
            a, _, b = r["expr"].split()
            out.add(tuple(sorted((int(a), int(b)))))
        return out

    for seed_train, seed_test in ((1, 1), (1, 2), (7, 3)):
        train = make_arithmetic_rows(
            "multiplication", 400, 2, seed_train, "train", 0.2, digits2=1
        )
        test = make_arithmetic_rows(
            "multiplication", 100, 2, seed_test, "test", 0.2, digits2=1
        )
        assert problems(train).isdisjoint(problems(test))
        assert all(len(r["expr"].split()[2]) == 1 for r in train)  # 1-digit b
    add_train = make_arithmetic_rows("addition", 500, 2, 1, "train", 0.2)
    add_test = make_arithmetic_rows("addition", 200, 2, 2, "test", 0.2)
    assert problems(add_train).isdisjoint(problems(add_test))
    # The split is by problem: the same problem always lands on the same side.
    assert held_out("addition", 12, 34, 0.2) == held_out("addition", 34, 12, 0.2)
    # Unsplit generation is what it always was (seeded runs stay comparable).
    assert make_arithmetic_rows("addition", 3, 2, 1) == make_arithmetic_rows(
        "addition", 3, 2, 1, "train", 0.0
    )
