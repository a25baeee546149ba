"""The search agent: BM25 retrieval, tool-call parsing, tool timeouts, the loss
mask of multi-turn trajectories (scripted engine), EM/F1 and the LLM judge."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest
import torch
from areal.api.cli_args import GenerationHyperparameters
from areal.api.io_struct import ModelRequest

from areal_marlaas.rollout.engine import MultiLoRAVLLMBackend
from areal_marlaas.tasks.answer_judge import JudgeClient, parse_verdict
from areal_marlaas.tasks.search import (
    BM25Index,
    Passage,
    exact_match,
    f1_score,
    get_index,
    qa_em_reward_fn,
    qa_f1_reward_fn,
)
from areal_marlaas.workflows.search_agent import parse_turn
from tests.support.search import CORPUS, ScriptedEngine, make_workflow, row, run

RLVR_KEYS = {"input_ids", "loss_mask", "logprobs", "versions", "attention_mask"}


# -- retrieval ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "query,title",
    [
        ("who directed the film Jaws", "Jaws (film)"),
        ("where was Spielberg born", "Steven Spielberg"),
        ("wrought-iron tower in Paris", "Eiffel Tower"),
    ],
)
def test_bm25_made_corpus_right_passage_ranks_first(corpus_path, query, title):
    hits = get_index(corpus_path).search(query, 3)

    assert hits[0].title == title
    assert len(hits) <= 3 and all(isinstance(h, Passage) for h in hits)


def test_bm25_index_built_once_per_corpus_path(corpus_path):
    assert get_index(corpus_path) is get_index(str(corpus_path))


def test_bm25_query_without_known_words_returns_nothing():
    assert BM25Index(CORPUS).search("the of zzzqqq", 3) == []


# -- tool-call parsing --------------------------------------------------------------
@pytest.mark.parametrize(
    "text,kind,value",
    [
        ("Look: <search>Jaws director</search>", "search", "Jaws director"),
        ("<answer> Cincinnati </answer>", "answer", "Cincinnati"),
        ("<search>a</search><answer>b</answer>", "search", "a"),
        ("<search>  </search>", "error", "empty search query"),
        ("<search>Jaws director", "error", "unclosed <search> tag"),
        ("<answer>Cinci", "error", "unclosed <answer> tag"),
        ("Cincinnati.", "error", "no answer (no <search> or <answer> tag)"),
        ("Jaws</search>", "error", "</search> without <search>"),
        ("<answer></answer>", "error", "empty answer"),
    ],
)  # fmt: skip
def test_parse_turn_cases_give_call_answer_or_reason(text, kind, value):
    turn = parse_turn(text)

    assert (turn.kind, turn.value) == (kind, value)


# -- scoring ------------------------------------------------------------------------
def test_em_and_f1_normalize_like_hotpotqa():
    assert exact_match("The Cincinnati, Ohio.", "cincinnati ohio") == 1.0
    assert exact_match("Cincinnati", "Cincinnati, Ohio") == 0.0
    assert f1_score("Cincinnati", "Cincinnati, Ohio") == pytest.approx(2 / 3)
    assert f1_score("yes", "no") == 0.0
    assert f1_score("Paris", "London") == 0.0


def test_qa_reward_fns_score_last_answer_tag_and_zero_without_one():
    text = "<search>x</search>\n<information>..</information>\n<answer>Ohio</answer>"

    assert qa_em_reward_fn("", text, answer="ohio") == 1.0
    assert qa_f1_reward_fn("", text, answer="Ohio River") == pytest.approx(2 / 3)
    assert qa_em_reward_fn("", "Ohio", answer="Ohio") == 0.0


# -- the workflow with a scripted engine ---------------------------------------------
def test_two_searches_then_answer_masks_tool_tokens_and_keeps_generated_ids(
    tokenizer, corpus_path
):
    turns = [
        "Let me search. <search>Jaws film director</search>",
        "<search>Steven Spielberg born</search>",
        "He was born in Cincinnati. <answer>Cincinnati</answer>",
    ]
    engine = ScriptedEngine(tokenizer, turns)
    wf = make_workflow(tokenizer, corpus_path)

    traj = run(wf, engine, row())

    extras = {"rewards", "task", "served_adapters", "env_intervals"}
    assert set(traj) == RLVR_KEYS | extras and traj["task"] == "wiki"
    # Two searches: two env intervals (start, end), in order.
    env = traj["env_intervals"]
    assert len(env) == 4 and env[0] <= env[1] <= env[2] <= env[3]
    length = traj["input_ids"].shape[1]
    for key in RLVR_KEYS:
        assert traj[key].shape == (1, length)
    assert traj["rewards"].shape == (1,) and traj["rewards"].item() == 1.0
    ids, mask = traj["input_ids"][0], traj["loss_mask"][0].bool()
    # Generated tokens: exactly what the engine returned, trained on.
    assert ids[mask].tolist() == sum(engine.outputs, [])
    assert set(traj["versions"][0][mask].tolist()) == {3}
    assert torch.all(traj["logprobs"][0][mask] == -0.25)
    # Everything else (prompt + tool output) is masked, logprob 0, version -1.
    assert torch.all(traj["logprobs"][0][~mask] == 0)
    assert set(traj["versions"][0][~mask].tolist()) == {-1}
    # Each turn's prompt is the previous turn's sequence plus the tool output.
    prompt_len = len(engine.requests[0].input_ids)
    tool_ids = ids[prompt_len:][~mask[prompt_len:]].tolist()
    tool_text = tokenizer.decode(tool_ids)
    assert tool_text.count("<information>") == 2
    assert "[Jaws (film)]" in tool_text and "[Steven Spielberg]" in tool_text
    for i in (1, 2):
        assert (
            engine.requests[i].input_ids
            == ids[: len(engine.requests[i].input_ids)].tolist()
        )
    # Requests stop at the closing tags and share the episode's token budget.
    assert {"</search>", "</answer>"} <= set(engine.requests[0].gconfig.stop)
    assert engine.requests[0].gconfig.lora_name == "wiki"
    used = len(engine.requests[2].input_ids) - prompt_len
    assert engine.requests[2].gconfig.max_new_tokens == 400 - used
    assert wf.outcomes[-1]["tool_calls"] == 2 and wf.outcomes[-1]["reason"] == ""


@pytest.mark.parametrize(
    "turns,max_calls,reason",
    [
        (["<search></search>"], 5, "empty search query"),
        (["<search>Jaws director"], 5, "unclosed <search> tag"),
        (["I do not know."], 5, "no answer (no <search> or <answer> tag)"),
        (["<search>Jaws</search>", "<search>Spielberg</search>"], 1,
         "more than max_tool_calls=1 searches"),
    ],
)  # fmt: skip
def test_malformed_episode_rewards_zero_with_reason(
    tokenizer, corpus_path, turns, max_calls, reason
):
    engine = ScriptedEngine(tokenizer, turns)
    wf = make_workflow(tokenizer, corpus_path, max_tool_calls=max_calls)

    traj = run(wf, engine, row())

    assert traj["rewards"].item() == 0.0
    assert wf.outcomes[-1]["reason"] == reason
    assert len(engine.requests) == len(turns)
    assert traj["loss_mask"].sum().item() == sum(len(o) for o in engine.outputs)


def test_budget_used_up_before_answer_rewards_zero(tokenizer, corpus_path):
    engine = ScriptedEngine(tokenizer, ["<search>Jaws film director</search>"] * 3)
    wf = make_workflow(tokenizer, corpus_path, budget=40)

    traj = run(wf, engine, row())

    prompt_len = len(engine.requests[0].input_ids)
    assert traj["rewards"].item() == 0.0
    assert traj["input_ids"].shape[1] <= prompt_len + 40
    assert wf.outcomes[-1]["reason"] in {
        "token budget used up before an answer",
        "unclosed <search> tag",
    }


SEARCH_RELEASED = threading.Event()


def slow_search(query: str, k: int) -> list[Passage]:
    SEARCH_RELEASED.wait(60)  # answers only once the test lets it
    return []


def test_slow_search_times_out_and_episode_continues(tokenizer, corpus_path):
    turns = ["<search>Jaws</search>", "<answer>Cincinnati</answer>"]
    engine = ScriptedEngine(tokenizer, turns)
    wf = make_workflow(
        tokenizer, corpus_path, search_fn=slow_search, tool_timeout_s=0.2
    )

    t0 = time.monotonic()
    try:
        traj = run(wf, engine, row())
        took = time.monotonic() - t0
        # The episode ended while the search still hung: cut at the 0.2 s tool
        # timeout (~0.3 s here; the search would wait 60 s).
        assert not SEARCH_RELEASED.is_set() and took < 10
    finally:
        SEARCH_RELEASED.set()
    mask = traj["loss_mask"][0].bool()
    tool_text = tokenizer.decode(traj["input_ids"][0][~mask].tolist())
    assert "Search timed out." in tool_text
    assert wf.outcomes[-1]["tool_timeouts"] == 1
    # The agent answered after the failed search, and that answer is scored.
    assert traj["rewards"].item() == 1.0


# -- stop strings reach the server ---------------------------------------------------
def test_backend_sends_stop_strings_only_when_set():
    backend = MultiLoRAVLLMBackend()
    gconfig = GenerationHyperparameters(max_new_tokens=8, lora_name="wiki")
    with_stop = ModelRequest(input_ids=[1, 2], gconfig=gconfig.new(stop=["</a>"]))
    without = ModelRequest(input_ids=[1, 2], gconfig=gconfig)

    assert backend.build_generation_request(with_stop, True, 0).payload["stop"] == [
        "</a>"
    ]
    assert "stop" not in backend.build_generation_request(without, True, 0).payload


def test_backend_sends_a_minimum_length_only_when_set():
    backend = MultiLoRAVLLMBackend()
    gconfig = GenerationHyperparameters(max_new_tokens=8, lora_name="wiki")
    at_least = ModelRequest(input_ids=[1, 2], gconfig=gconfig.new(min_new_tokens=8))
    without = ModelRequest(input_ids=[1, 2], gconfig=gconfig)

    assert (
        backend.build_generation_request(at_least, True, 0).payload["min_tokens"] == 8
    )
    assert (
        "min_tokens" not in backend.build_generation_request(without, True, 0).payload
    )


# -- the judge ----------------------------------------------------------------------
def test_parse_verdict_reads_first_word_or_none():
    assert parse_verdict("Yes, it matches.") == 1.0
    assert parse_verdict(" no") == 0.0
    assert parse_verdict("Correct") == 1.0
    assert parse_verdict("The answer is right") is None


def test_judge_unresponsive_endpoint_times_out_retries_and_scores_zero():
    # A socket that accepts connections but never answers.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1/chat/completions"
        judge = JudgeClient(url, "m", timeout_s=0.3, retries=2, backoff_s=0.05)

        t0 = time.monotonic()
        result = asyncio.run(judge.score("q", "gold", "pred"))

    assert result.score == 0.0 and result.attempts == 3
    assert "timed out" in result.reason
    assert time.monotonic() - t0 >= 0.9


def test_judge_refused_connection_scores_zero_without_raising():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens
    judge = JudgeClient(f"http://127.0.0.1:{port}/v1/completions", "m", 1.0, 1, 0.01)

    result = asyncio.run(judge.score("q", "gold", "pred"))

    assert (result.score, result.attempts) == (0.0, 2)
    assert "failed" in result.reason


def test_response_prefix_is_masked_prompt_and_starts_the_first_call(
    tokenizer, corpus_path
):
    turns = [" Jaws film director</search>", "<answer>Steven Spielberg</answer>"]
    engine = ScriptedEngine(tokenizer, turns)
    wf = make_workflow(tokenizer, corpus_path, response_prefix="<search>")
    data = row("Who directed Jaws?", "Steven Spielberg")

    traj = run(wf, engine, data)

    prompt = engine.requests[0].input_ids
    assert tokenizer.decode(prompt).endswith("<search>")
    mask = traj["loss_mask"][0].bool()
    assert not mask[: len(prompt)].any()
    assert traj["input_ids"][0][mask].tolist() == sum(engine.outputs, [])
    assert wf.outcomes[-1]["tool_calls"] == 1 and traj["rewards"].item() == 1.0
