"""Graders: spec validation, templates, the formula parser, every local type
against hand-computed or library-documented scores, SDK-shaped results, and the
training reward adapter."""

from __future__ import annotations

import asyncio
import math
import pickle
from concurrent.futures import ProcessPoolExecutor

import pytest
from openai._models import construct_type
from openai.types.fine_tuning.alpha import GraderRunResponse, GraderValidateResponse

from areal_marlaas.graders import (
    GraderError,
    GraderReward,
    GradingContext,
    Score,
    build_sample,
    check_grader,
    grade_batch_sync,
    grader_to_dict,
    parse_grader,
    register_grader_type,
    run_grader,
    run_grader_sync,
    unregister_grader_type,
    validate_grader,
    validate_response,
)
from areal_marlaas.graders.formula import parse_formula
from areal_marlaas.graders.templates import TemplateError, parse_template


def sc(op: str, input: str = "{{ sample.output_text }}", ref: str = "{{ item.ref }}"):
    return {
        "type": "string_check",
        "name": "sc",
        "input": input,
        "reference": ref,
        "operation": op,
    }


def ts(metric: str) -> dict:
    return {
        "type": "text_similarity",
        "name": "ts",
        "input": "{{ sample.output_text }}",
        "reference": "{{ item.ref }}",
        "evaluation_metric": metric,
    }


def grade(spec: dict, output: str, item: dict | None = None, ctx=None):
    return run_grader_sync(parse_grader(spec), output, item or {}, ctx)


# --- templates ----------------------------------------------------------------


def test_template_renders_item_sample_and_json_paths():
    sample = build_sample('{"x": {"y": [10, "b"]}, "n": 3}')
    item = {"a": {"b": "deep"}, "list": [1, {"k": "v"}], "num": 2.5, "s": "str"}
    tpl = parse_template(
        "{{item.a.b}}|{{ item.list.1.k }}|{{  sample.output_json.x.y.0 }}|"
        "{{item.num}}|{{ item.s }}|{{ sample.output_json.x }}|{{sample.output_text}}",
        "p",
    )
    assert tpl.render(sample, item) == (
        'deep|v|10|2.5|str|{"y": [10, "b"]}|{"x": {"y": [10, "b"]}, "n": 3}'
    )


def test_template_missing_key_names_template_and_key():
    tpl = parse_template("answer: {{ item.answer.value }}", "p")
    with pytest.raises(TemplateError) as e:
        tpl.render(build_sample("x"), {"answer": {"other": 1}})
    assert "answer: {{ item.answer.value }}" in str(e.value)
    assert "item.answer has no key 'value'" in str(e.value)
    with pytest.raises(TemplateError) as e:
        parse_template("{{ sample.output_json.x }}", "p").render(build_sample("7"), {})
    assert e.value.sample_parse and "not a JSON object" in str(e.value)


@pytest.mark.parametrize(
    "text, why",
    [
        ("{{ foo.x }}", "namespace 'foo'"),
        ("{{ item }}", "bad template reference"),
        ("{{ item.x + 1 }}", "bad template reference"),
        ("{{ item.__class__.x() }}", "bad template reference"),
        ("{{ sample.secret }}", "not 'secret'"),
        ("hello {{ item.x", "unclosed"),
    ],
)
def test_template_rejects_bad_references(text, why):
    with pytest.raises(GraderError) as e:
        parse_grader(sc("eq", input=text))
    assert why in str(e.value)
    assert e.value.param == "grader.input"


def test_build_sample_output_json_only_for_objects():
    assert build_sample('{"a": 1}')["output_json"] == {"a": 1}
    assert build_sample("[1, 2]")["output_json"] is None
    assert build_sample("not json")["output_json"] is None


# --- string_check -------------------------------------------------------------


@pytest.mark.parametrize(
    "op, output, ref, want",
    [
        ("eq", "Paris", "Paris", 1.0),
        ("eq", "Paris", "paris", 0.0),
        ("eq", "Paris ", "Paris", 0.0),
        ("ne", "Paris", "London", 1.0),
        ("ne", "Paris", "Paris", 0.0),
        ("like", "The capital is Paris.", "Paris", 1.0),
        ("like", "The capital is paris.", "Paris", 0.0),
        ("like", "Paris", "The capital is Paris", 0.0),
        ("ilike", "THE CAPITAL IS PARIS.", "paris", 1.0),
        ("ilike", "Lyon", "paris", 0.0),
    ],
)
def test_string_check_operations(op, output, ref, want):
    assert grade(sc(op), output, {"ref": ref}).reward == want


# --- text_similarity against documented examples ------------------------------

# nltk's documented example sentences (bleu_score, gleu_score, meteor_score).
HYP1 = (
    "It is a guide to action which ensures that the military always obeys "
    "the commands of the party"
)
HYP2 = (
    "It is to insure the troops forever hearing the activity guidebook that "
    "party direct"
)
REF1 = (
    "It is a guide to action that ensures that the military will forever heed "
    "Party commands"
)


def test_fuzzy_match_rapidfuzz_readme_example():
    # rapidfuzz README: fuzz.ratio("this is a test", "this is a test!") = 96.55;
    # by hand: one insertion over 14 + 15 characters.
    got = grade(ts("fuzzy_match"), "this is a test", {"ref": "this is a test!"})
    assert got.reward == pytest.approx(1 - 1 / 29)


def test_bleu_single_reference_by_hand():
    # Clipped n-gram matches of HYP1 (18 tokens) against REF1 (16), counted by
    # hand: 11/18 unigrams, 8/17 bigrams, 6/16 trigrams, 4/15 4-grams; no
    # brevity penalty (18 > 16); uniform weights.
    want = (11 / 18 * 8 / 17 * 6 / 16 * 4 / 15) ** 0.25
    assert grade(ts("bleu"), HYP1, {"ref": REF1}).reward == pytest.approx(want)


def test_bleu_is_smoothed_for_short_answers():
    # A 2-token answer has no 3- or 4-grams; smoothing method1 counts those
    # precisions as 0.1 (epsilon over a denominator of 1) instead of 0; unigram
    # and bigram precision are 1; brevity penalty exp(1 - 3/2).
    want = math.exp(1 - 3 / 2) * (1 * 1 * 0.1 * 0.1) ** 0.25
    got = grade(ts("bleu"), "the cat", {"ref": "the cat sat"}).reward
    assert got == pytest.approx(want)


def test_gleu_nltk_documented_values():
    assert grade(ts("gleu"), HYP1, {"ref": REF1}).reward == pytest.approx(
        0.4393, abs=1e-4
    )
    assert grade(ts("gleu"), HYP2, {"ref": REF1}).reward == pytest.approx(
        0.1206, abs=1e-4
    )
    got = grade(
        ts("gleu"), "the the the the the the the", {"ref": "the cat is on the mat"}
    )
    assert got.reward == pytest.approx(0.0909, abs=1e-4)


def test_meteor_nltk_documented_value():
    # nltk: round(single_meteor_score(reference1, hypothesis1), 4) == 0.6944
    assert round(grade(ts("meteor"), HYP1, {"ref": REF1}).reward, 4) == 0.6944
    got = grade(ts("meteor"), "non matching hypothesis", {"ref": "this is a cat"})
    assert got.reward == 0.0


def test_meteor_matches_wordnet_synonyms():
    # car/auto share WordNet 3.0's synset car.n.01 (and Porter leaves both
    # unchanged), so all 3 words align in one chunk: P = R = Fmean = 1 and the
    # penalty is gamma * (chunks / matches) ^ beta = 0.5 * (1/3)^3 (nltk's
    # defaults). Without synonyms it would be 2 matches in 2 chunks: 1/3.
    got = grade(ts("meteor"), "a red car", {"ref": "a red auto"})
    assert got.reward == pytest.approx(1 - 0.5 * (1 / 3) ** 3)


@pytest.mark.parametrize(
    "metric, want",
    [
        # rouge-score README example, counted by hand: target 9 tokens,
        # prediction 8; F = 2 * overlap / (9 + 8) etc.
        ("rouge_1", 12 / 17),  # the x2, quick, brown, dog, jumps
        ("rouge_2", 4 / 15),  # "the quick", "quick brown"; 8 and 7 bigrams
        ("rouge_3", 2 / 13),  # "the quick brown"; 7 and 6 trigrams
        ("rouge_l", 10 / 17),  # LCS "the quick brown jumps the"
    ],
)
def test_rouge_readme_example_by_hand(metric, want):
    item = {"ref": "The quick brown fox jumps over the lazy dog"}
    got = grade(ts(metric), "The quick brown dog jumps on the log.", item)
    assert got.reward == pytest.approx(want)


def test_rouge_4_and_5_identical_text_scores_one():
    text = "one two three four five six"
    assert grade(ts("rouge_5"), text, {"ref": text}).reward == pytest.approx(1.0)
    assert grade(ts("rouge_4"), "one two three", {"ref": text}).reward == 0.0


# --- the formula parser -------------------------------------------------------


@pytest.mark.parametrize(
    "text, want",
    [
        ("1 + 2 * 3", 7),
        ("(1 + 2) * 3", 9),
        ("2 * 3 ^ 2", 18),
        ("-2 ^ 2", -4),
        ("2 ^ 3 ^ 2", 512),
        ("2 ^ -1", 0.5),
        ("--a", 0.5),
        ("a - b - c", 0.5 - 0.25 - 2),
        ("a / b / c", 0.5 / 0.25 / 2),
        ("min(a, b, c)", 0.25),
        ("max(a, b)", 0.5),
        ("abs(b - c)", 1.75),
        ("floor(c + 0.7) + ceil(a)", 3),
        ("exp(0) + sqrt(4) + log(1)", 3),
        ("0.5*a + 0.5*b", 0.375),
        ("1e-1 * 10", 1),
    ],
)
def test_formula_values(text, want):
    f = parse_formula(text, {"a", "b", "c"}, "p")
    assert f.evaluate({"a": 0.5, "b": 0.25, "c": 2.0}) == pytest.approx(want)


@pytest.mark.parametrize(
    "text, why",
    [
        ("__import__(a)", "unknown function '__import__'"),
        ("__import__('os')", 'unexpected "\'"'),
        ("a.__class__", "unexpected '.'"),
        ("a[0]", "unexpected '['"),
        ("a ** 2", "unexpected '*'"),
        ("pow(a, 2)", "unknown function 'pow'"),
        ("lambda: 1", "unexpected ':'"),
        ("a if b else a", "unexpected 'if'"),
        ("x + 1", "unknown name 'x'"),
        ("min(a)", "min() takes 2 or more arguments"),
        ("abs(a, b)", "abs() takes 1 argument"),
        ("sqrt", "is a function"),
        ("", "it is empty"),
        ("a b", "unexpected 'b'"),
        ("1 +", "unexpected end"),
        ("(a", "expected ')'"),
        ("(" * 100 + "a" + ")" * 100, "nested deeper"),
        ("a == b", "unexpected '='"),
    ],
)
def test_formula_rejects(text, why):
    with pytest.raises(GraderError) as e:
        parse_formula(text, {"a", "b"}, "grader.calculate_output")
    assert why in str(e.value)
    assert e.value.param == "grader.calculate_output"


def test_formula_runtime_errors_score_zero_with_reason():
    spec = {
        "type": "multi",
        "name": "m",
        "graders": {"a": sc("eq"), "b": sc("ne")},
        "calculate_output": "a / b",
    }
    res = grade(spec, "x", {"ref": "x"})  # a = 1, b = 0
    assert res.reward == 0.0
    assert res.errors["other_error"] is True
    assert "division by zero" in res.reason
    spec["calculate_output"] = "sqrt(b - 1)"
    res = grade(spec, "x", {"ref": "x"})
    assert res.reward == 0.0 and "math domain error" in res.reason
    spec["calculate_output"] = "(a + 9) ^ 9 ^ 9"
    res = grade(spec, "x", {"ref": "x"})
    assert res.reward == 0.0 and "calculate_output" in res.reason


# --- multi --------------------------------------------------------------------


def test_multi_combines_sub_graders():
    spec = {
        "type": "multi",
        "name": "combo",
        "graders": {
            "exact": sc("eq", ref="{{ item.answer }}"),
            "has": sc("ilike", ref="{{ item.keyword }}"),
            "sim": ts("rouge_1") | {"reference": "{{ item.answer }}"},
        },
        "calculate_output": "0.5 * exact + 0.25 * has + 0.25 * sim",
    }
    res = grade(spec, "Paris is the capital", {"answer": "Paris", "keyword": "CAPITAL"})
    # exact 0, has 1, rouge_1 F = 2 * 1 / (4 + 1)
    assert res.sub_rewards == {"exact": 0.0, "has": 1.0, "sim": pytest.approx(0.4)}
    assert res.reward == pytest.approx(0.25 + 0.25 * 0.4)
    assert res.metadata["scores"] == res.sub_rewards
    assert res.reason == ""


def test_multi_sub_grader_error_scores_that_key_zero():
    spec = {
        "type": "multi",
        "name": "m",
        "graders": {"a": sc("eq", ref="{{ item.missing }}"), "b": sc("like")},
        "calculate_output": "a + b",
    }
    res = grade(spec, "abc", {"ref": "b"})
    assert res.sub_rewards == {"a": 0.0, "b": 1.0} and res.reward == 1.0
    assert res.errors["invalid_variable_error"] is True
    assert "item has no key 'missing'" in res.errors["messages"]["a"]


def test_multi_reports_each_sub_grader_with_its_errors():
    spec = {
        "type": "multi",
        "name": "m",
        "graders": {"a": sc("eq", ref="{{ item.missing }}"), "b": ts("rouge_1")},
        "calculate_output": "a + b",
    }
    res = grade(spec, "abc", {"ref": "abc"})
    by_name = {g["name"]: g for g in res.per_grader}
    assert set(by_name) == {"a", "b"}
    assert (by_name["a"]["type"], by_name["a"]["score"]) == ("string_check", 0.0)
    assert by_name["a"]["errors"] == ["invalid_variable_error"]
    assert (by_name["b"]["type"], by_name["b"]["score"]) == ("text_similarity", 1.0)
    assert by_name["b"]["errors"] == []


def test_a_score_carries_the_grades_across_processes():
    reward = GraderReward(multi({"a": sc("eq"), "b": sc("like")}, "a + b"))
    with ProcessPoolExecutor(1) as pool:
        score = pool.submit(reward, "p", "abc", ref="abc").result()
    assert isinstance(score, Score) and float(score) == 2.0
    assert [(g["name"], g["score"]) for g in score.grades] == [("a", 1.0), ("b", 1.0)]


# --- validation ----------------------------------------------------------------


def multi(graders: dict, formula: str = "a") -> dict:
    return {
        "type": "multi",
        "name": "m",
        "graders": graders,
        "calculate_output": formula,
    }


@pytest.mark.parametrize(
    "spec, param, why",
    [
        (sc("eq") | {"extra": 1}, "grader.extra", "unknown field"),
        ({"name": "x"}, "grader.type", "grader.type is required"),
        (sc("eq") | {"type": "regex"}, "grader.type", "unknown grader type 'regex'"),
        (sc("contains"), "grader.operation", "use one of eq, ne, like, ilike"),
        (sc("eq") | {"name": 3}, "grader.name", "must be a string"),
        (
            {k: v for k, v in sc("eq").items() if k != "reference"},
            "grader.reference",
            "is required",
        ),
        (ts("bertscore"), "grader.evaluation_metric", "unknown value 'bertscore'"),
        (
            multi({"a": ts("rouge_9")}),
            "grader.graders.a.evaluation_metric",
            "unknown value 'rouge_9'",
        ),
        (multi({"a": multi({"a": sc("eq")})}), "grader.graders.a.type", "nested"),
        (
            multi({"a": sc("eq")}, "a + b"),
            "grader.calculate_output",
            "unknown name 'b'",
        ),
        (multi({"1a": sc("eq")}), "grader.graders.1a", "identifier"),
        (multi({"max": sc("eq")}, "1"), "grader.graders.max", "function name"),
        (multi(sc("eq")), "grader.graders", "not be one grader"),
        (multi({}), "grader.graders", "non-empty object"),
        (
            {"type": "python", "name": "p", "source": "x" * (256 * 1024 + 1)},
            "grader.source",
            "the limit is 262144",
        ),
        (
            {"type": "python", "name": "p", "source": "def grade(:"},
            "grader.source",
            "does not compile",
        ),
        (
            {"type": "python", "name": "p", "source": "1", "image_tag": 3},
            "grader.image_tag",
            "must be a string",
        ),
        ("not a dict", "grader", "must be an object"),
    ],
)
def test_validation_errors_name_the_field(spec, param, why):
    with pytest.raises(GraderError) as e:
        parse_grader(spec)
    assert e.value.param == param
    assert why in str(e.value)
    assert isinstance(e.value, ValueError)


def score_model(**over) -> dict:
    spec = {
        "type": "score_model",
        "name": "judge",
        "model": "judge-model",
        "input": [
            {"role": "system", "content": "Grade 0-10. Reply with a number."},
            {"role": "user", "content": "Q: {{ item.q }}\nA: {{ sample.output_text }}"},
        ],
        "range": [0, 10],
        "sampling_params": {"temperature": 0, "max_completions_tokens": 8, "seed": 1},
    }
    spec.update(over)
    return spec


@pytest.mark.parametrize(
    "over, param, why",
    [
        ({"range": [1, 1]}, "grader.range", "low must be below high"),
        ({"range": [0]}, "grader.range", "two finite numbers"),
        ({"range": [0, "10"]}, "grader.range", "two finite numbers"),
        (
            {"sampling_params": {"temp": 1}},
            "grader.sampling_params.temp",
            "unknown field",
        ),
        ({"sampling_params": {"top_p": 2}}, "grader.sampling_params.top_p", "(0, 1]"),
        ({"input": []}, "grader.input", "non-empty list"),
        (
            {"input": [{"role": "robot", "content": "x"}]},
            "grader.input.0.role",
            "unknown value 'robot'",
        ),
        (
            {
                "input": [
                    {
                        "role": "user",
                        "content": [{"type": "input_image", "image_url": "u"}],
                    }
                ]
            },
            "grader.input.0.content.0.type",
            "text-only",
        ),
        (
            {"input": [{"role": "user", "content": "{{ itm.q }}"}]},
            "grader.input.0.content",
            "namespace 'itm'",
        ),
    ],
)
def test_score_model_validation(over, param, why):
    with pytest.raises(GraderError) as e:
        parse_grader(score_model(**over))
    assert e.value.param == param and why in str(e.value)


def test_check_grader_against_the_server():
    ctx = GradingContext()
    with pytest.raises(GraderError) as e:
        validate_grader(ts("cosine"), ctx)
    assert e.value.param == "grader.evaluation_metric"
    assert "embedding model" in str(e.value)
    with pytest.raises(GraderError) as e:
        validate_grader(multi({"a": score_model()}), ctx)
    assert e.value.param == "grader.graders.a.model"
    ctx = GradingContext(judge_base_url="http://127.0.0.1:1/v1", judge_models=("x",))
    with pytest.raises(GraderError) as e:
        validate_grader(score_model(), ctx)
    assert "'judge-model' is not available" in str(e.value) and "x" in str(e.value)
    validate_grader(score_model(model="x"), ctx)
    py = {
        "type": "python",
        "name": "p",
        "source": "def grade(s, i):\n    return 1",
        "image_tag": "2025-05-08",
    }
    with pytest.raises(GraderError) as e:
        validate_grader(py, ctx)
    assert e.value.param == "grader.image_tag"
    validate_grader(py, GradingContext(python_image_tags=("2025-05-08",)))
    validate_grader(ts("meteor"))  # WordNet is packaged: meteor is available


def test_grader_to_dict_round_trips():
    specs = [
        sc("ilike"),
        ts("rouge_l"),
        {"type": "python", "name": "p", "source": "def grade(s, i):\n    return 1"},
        score_model(),
        score_model(range=None, sampling_params=None)
        | {
            "input": [
                {
                    "role": "user",
                    "content": [{"type": "input_text", "text": "{{item.q}}"}],
                }
            ]
        },
        multi({"a": sc("eq"), "b": score_model()}, "a * b"),
    ]
    for spec in specs:
        spec = {k: v for k, v in spec.items() if v is not None}
        g = parse_grader(spec)
        d = grader_to_dict(g)
        assert parse_grader(d) == g
        assert d["type"] == spec["type"] and d["name"] == spec["name"]
    no_range = {k: v for k, v in score_model().items() if k != "range"}
    assert grader_to_dict(parse_grader(no_range))["range"] == [0.0, 1.0]


# --- extension registry ---------------------------------------------------------


@pytest.fixture
def demo_type():
    def parse(spec: dict, param: str):
        if spec.get("kind") not in ("addition", "gsm8k"):
            raise GraderError(
                f"{param}.kind: use addition or gsm8k, got {spec.get('kind')!r}",
                f"{param}.kind",
            )
        return spec["kind"]

    async def run(kind, sample, item, ctx):
        return float(sample["output_text"].strip() == str(item["answer"]))

    register_grader_type("demo_kind", parse, run)
    yield
    unregister_grader_type("demo_kind")


def test_registered_type_parses_runs_and_nests(demo_type):
    spec = {"type": "demo_kind", "name": "m", "kind": "addition"}
    assert grade(spec, "12", {"answer": 12}).reward == 1.0
    assert grader_to_dict(parse_grader(spec)) == spec
    with pytest.raises(GraderError) as e:
        parse_grader({"type": "demo_kind", "kind": "chess"})
    assert e.value.param == "grader.kind"
    res = grade(
        multi({"a": spec, "b": sc("eq", ref="{{ item.answer }}")}, "a + b"),
        "12",
        {"answer": 12},
    )
    assert res.reward == 2.0
    with pytest.raises(ValueError):
        register_grader_type("python", lambda s, p: s, lambda *a: 1.0)


def test_unregistered_type_is_unknown():
    with pytest.raises(GraderError) as e:
        parse_grader({"type": "demo_kind", "kind": "addition"})
    assert "unknown grader type 'demo_kind'" in str(e.value)


def test_extension_failures_score_zero(demo_type):
    res = grade({"type": "demo_kind", "name": "m", "kind": "gsm8k"}, "1", {})
    assert res.reward == 0.0 and res.errors["other_error"]
    assert "KeyError" in res.reason


# --- run-time failures and result shapes ------------------------------------------


def test_missing_template_key_scores_zero_with_reason():
    res = grade(sc("eq", ref="{{ item.answer }}"), "x", {"question": "q"})
    assert res.reward == 0.0
    assert res.errors["invalid_variable_error"] is True
    assert "{{ item.answer }}" in res.reason and "'answer'" in res.reason
    res = grade(sc("eq", input="{{ sample.output_json.a }}"), "not json", {"ref": "1"})
    assert res.errors["sample_parse_error"] is True and res.reward == 0.0


def test_run_response_parses_with_the_sdk_model():
    results = [
        grade(sc("eq"), "a", {"ref": "a"}),
        grade(
            multi({"a": sc("eq"), "b": sc("eq", ref="{{ item.nope }}")}, "a / b"),
            "a",
            {"ref": "a"},
        ),
        grade(
            {"type": "python", "name": "p", "source": "def grade(s, i):\n  1/0"}, "a"
        ),
    ]
    for res in results:
        body = res.to_dict()
        parsed = GraderRunResponse.model_validate(body)
        assert parsed.reward == res.reward
        assert parsed.sub_rewards == res.sub_rewards
        assert parsed.metadata.name == res.metadata["name"]
        errs = parsed.metadata.errors
        assert errs.other_error == body["metadata"]["errors"]["other_error"]
        assert errs.api_model_grader_parse_error is False
    assert results[0].reward == 1.0 and not results[0].reason
    multi_errs = GraderRunResponse.model_validate(results[1].to_dict()).metadata.errors
    assert multi_errs.invalid_variable_error and multi_errs.other_error
    py = GraderRunResponse.model_validate(results[2].to_dict()).metadata.errors
    assert py.python_grader_runtime_error
    assert "ZeroDivisionError" in py.python_grader_runtime_error_details


def test_validate_response_parses_with_the_sdk_model():
    for spec in (
        sc("eq"),
        ts("bleu"),
        score_model(),
        {"type": "python", "name": "p", "source": "def grade(s, i):\n  1"},
    ):
        body = validate_response(parse_grader(spec))
        parsed = GraderValidateResponse.model_validate(body)
        assert parsed.grader.type == spec["type"]
        assert parsed.grader.name == spec["name"]
    # The SDK types MultiGrader.graders as ONE grader while the API (and this
    # module) use a key -> grader object, so strict validation of a multi
    # grader fails; the client parses responses leniently with construct_type,
    # which keeps the graders object.
    body = validate_response(parse_grader(multi({"a": sc("eq")}, "a")))
    parsed = construct_type(type_=GraderValidateResponse, value=body)
    assert parsed.grader.type == "multi" and parsed.grader.graders["a"]["name"] == "sc"


def test_sync_wrapper_works_inside_a_running_loop():
    g = parse_grader(sc("eq"))

    async def main():
        direct = await run_grader(g, "x", {"ref": "x"})
        nested = run_grader_sync(g, "x", {"ref": "x"})
        return direct.reward, nested.reward

    assert asyncio.run(main()) == (1.0, 1.0)


def test_grade_batch_one_result_per_pair():
    g = parse_grader(sc("eq"))
    res = grade_batch_sync(g, [("a", {"ref": "a"}), ("b", {"ref": "a"}), ("c", None)])
    assert [r.reward for r in res] == [1.0, 0.0, 0.0]
    assert res[2].errors["invalid_variable_error"]


# --- the training reward adapter ---------------------------------------------------


def test_score_keeps_reason_through_pickle():
    s = Score(0.0, "timeout")
    back = pickle.loads(pickle.dumps(s))
    assert isinstance(back, Score) and back == 0.0 and back.reason == "timeout"
    assert Score(1.5).reason == "" and math.isclose(Score(1.5) + 1, 2.5)


PY_EXACT = {
    "type": "python",
    "name": "exact",
    "source": "def grade(sample, item):\n"
    "    return float(sample['output_text'].strip() == str(item['answer']))\n",
}


def test_grader_reward_in_a_process_pool_worker():
    rewards = [
        GraderReward(sc("eq", ref="{{ item.answer }}")),
        GraderReward(PY_EXACT, {"sandbox": {"wall_s": 30}}),
    ]
    for fn in rewards:
        fn2 = pickle.loads(pickle.dumps(fn))
        assert fn2("p", "42", [1], [2], answer="42") == 1.0
    with ProcessPoolExecutor(max_workers=1) as pool:
        for fn in rewards:
            good = pool.submit(fn, "p", "42", [1], [2], answer="42").result(60)
            bad = pool.submit(fn, "p", "41", None, None, answer="42").result(60)
            missing = pool.submit(fn, "p", "41", None, None, question="q").result(60)
            assert isinstance(good, Score) and good == 1.0 and good.reason == ""
            assert bad == 0.0 and bad.reason == ""
            assert missing == 0.0 and "answer" in missing.reason


def test_grader_reward_rejects_bad_spec_at_construction():
    with pytest.raises(GraderError):
        GraderReward(sc("bogus"))


def test_check_grader_accepts_context_dict_round_trip():
    ctx = GradingContext(judge_base_url="http://h/v1", judge_models=("*",))
    again = GradingContext.from_dict(ctx.to_dict())
    assert again == ctx
    check_grader(parse_grader(score_model(model="anything")), again)
