"""Math-equivalence reward (math-verify) and the AMC / MATH / wiki_search kinds."""

from __future__ import annotations

import json

import pytest

from areal_marlaas.config import ConfigError, SearchConfig, TaskDatasetConfig, TaskSpec
from areal_marlaas.tasks import KINDS, SEARCH_WORKFLOW, load_task_rows
from areal_marlaas.tasks.competition_math import math_verify_reward_fn, reference_answer
from areal_marlaas.workflows import RLVR_WORKFLOW as WORKFLOW
from areal_marlaas.workflows import task_workflow
from tests.support.paths import SHARED_DATA

needs_data = pytest.mark.skipif(
    not SHARED_DATA.is_dir(), reason=f"no shared data at {SHARED_DATA}"
)


@pytest.mark.parametrize(
    "completion,answer",
    [
        ("So x = \\boxed{\\frac{1}{2}}.", "0.5"),
        ("The answer is \\boxed{0.5}", "\\frac{1}{2}"),
        ("\\boxed{142}", 142.0),
        ("m+n = 142, so the answer is 142.", 142.0),
        ("\\boxed{(3, \\frac{\\pi}{2})}", "\\left( 3, \\frac{\\pi}{2} \\right)"),
        ("\\boxed{p-q}", "p - q"),
        ("first \\boxed{7} then \\boxed{\\sqrt{4}}", "2"),
    ],
)
def test_math_reward_equivalent_answers_score_one(completion, answer):
    assert math_verify_reward_fn("", completion, answer=answer) == 1.0


@pytest.mark.parametrize(
    "completion,answer",
    [
        ("\\boxed{143}", 142.0),
        ("\\boxed{\\frac{1}{3}}", "0.5"),
        ("I cannot solve this.", "7"),
        ("\\boxed{", "7"),
    ],
)
def test_math_reward_wrong_or_missing_answers_score_zero(completion, answer):
    assert math_verify_reward_fn("", completion, answer=answer) == 0.0


def test_reference_answer_prefers_answer_then_last_boxed_of_solution():
    assert reference_answer({"answer": 142.0}) == "142"
    assert reference_answer({"answer": "\\frac{14}{3}"}) == "\\frac{14}{3}"
    assert reference_answer({"solution": "so \\boxed{5} and \\boxed{6}"}) == "6"
    with pytest.raises(ValueError):
        reference_answer({"solution": "no box"})


def spec(name: str, kind: str, path: str, **kw) -> TaskSpec:
    return TaskSpec(
        name=name, kind=kind, dataset=TaskDatasetConfig(path=path, size=5), **kw
    )


def test_math_kind_reads_solution_only_records(tmp_path):
    path = tmp_path / "math.jsonl"
    path.write_text(json.dumps({"problem": "1+1?", "solution": "\\boxed{2}"}) + "\n")

    (r,) = load_task_rows(spec("m", "math", str(path)))

    assert r["answer"] == "2" and "\\boxed{}" in r["messages"][0]["content"]
    assert KINDS["math"].reward_fn.endswith("math_verify_reward_fn")


@needs_data
@pytest.mark.parametrize(
    "kind,rel",
    [
        ("amc", "amc/amc12_2022_2023.json"),
        ("math", "math/math_train.json"),
        ("math", "math/math500_test.jsonl"),
    ],
)
def test_shared_math_datasets_load_with_answers(kind, rel):
    rows = load_task_rows(spec("t", kind, str(SHARED_DATA / rel)))

    assert len(rows) == 5
    assert all(r["answer"] and r["messages"][0]["role"] == "user" for r in rows)


@needs_data
def test_amc_reference_scores_one_against_its_own_answer():
    rows = load_task_rows(
        spec("t", "amc", str(SHARED_DATA / "amc/amc12_2022_2023.json"))
    )
    r = rows[0]

    assert math_verify_reward_fn("", f"\\boxed{{{r['answer']}}}", **r) == 1.0


# -- wiki_search: config and workflow routing ---------------------------------------
def wiki(tmp_path, **search) -> TaskSpec:
    data = tmp_path / "qa.jsonl"
    data.write_text(json.dumps({"question": "Who?", "answer": "Ann"}) + "\n")
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"id": 0, "title": "Ann", "text": "Ann is."}) + "\n")
    return spec(
        "wiki",
        "wiki_search",
        str(data),
        search=SearchConfig(**{"corpus_path": str(corpus), **search}),
    )


def test_wiki_search_kind_uses_agent_workflow_with_its_settings(tmp_path):
    task = wiki(tmp_path, scorer="f1", max_tool_calls=2)

    path, kwargs = task_workflow(task, "tok")
    (r,) = load_task_rows(task)

    assert path == SEARCH_WORKFLOW
    assert kwargs["reward_fn"].endswith("qa_f1_reward_fn")
    assert kwargs["max_tool_calls"] == 2 and kwargs["gconfig"].lora_name == "wiki"
    assert kwargs["corpus_path"] == str(tmp_path / "corpus.jsonl")
    # The prompt shows the tag format with a worked example.
    prompt = r["messages"][0]["content"]
    assert "<search>" in prompt and "<answer>" in prompt and "at most 2" in prompt


def test_single_turn_kinds_keep_the_rlvr_workflow(tmp_path):
    path, kwargs = task_workflow(spec("a", "amc", "x.json"), "tok")

    assert path == WORKFLOW and "corpus_path" not in kwargs


@pytest.mark.parametrize(
    "search,field",
    [
        ({"corpus_path": ""}, "search.corpus_path"),
        ({"scorer": "bleu"}, "search.scorer"),
        ({"scorer": "judge"}, "search.judge_url"),
        ({"scorer": "judge", "judge_url": "http://h:1/v1/completions"}, "judge_model"),
        ({"top_k": 0}, "search.top_k"),
        ({"tool_timeout_s": 0}, "search.tool_timeout_s"),
        ({"judge_retries": -1}, "search.judge_retries"),
    ],
)
def test_bad_search_settings_raise_config_error_naming_field(tmp_path, search, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        wiki(tmp_path, **search)


def test_math_records_without_any_answer_are_skipped(tmp_path):
    path = tmp_path / "math.json"
    recs = [{"problem": "a", "answer": None}, {"problem": "b", "answer": "3"}]
    path.write_text(json.dumps(recs))

    rows = load_task_rows(spec("m", "math", str(path)))

    assert [r["question"] for r in rows] == ["b"]
