"""Agentic wiki search (HotpotQA): prompts, a cached BM25 index over a local
corpus, answer extraction and EM/F1 rewards (normalized as in HotpotQA's eval)."""

from __future__ import annotations

import re
import string
import threading
from collections import Counter
from pathlib import Path

from areal.utils import logging

from areal_marlaas.tasks.records import read_records
from areal_marlaas.tools.bm25 import BM25Index
from areal_marlaas.tools.bm25 import Passage as Passage  # re-exported
from areal_marlaas.tools.bm25 import format_passages as format_passages

logger = logging.getLogger("MARLaaSSearch")

SEARCH_OPEN, SEARCH_CLOSE = "<search>", "</search>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
INFO_OPEN, INFO_CLOSE = "<information>", "</information>"

# Small models emit no tags unless shown them: the prompt carries a worked example.
PROMPT = (
    "Answer the question. You can search Wikipedia: write "
    "<search>query</search> and the results appear between <information> and "
    "</information>. Search at most {max_calls} times, then give a short final "
    "answer between <answer> and </answer>.\n\n"
    "Example:\n"
    "Question: In which city was the director of Jaws born?\n"
    "<search>Jaws film director</search>\n"
    "<information>[Jaws (film)] Jaws is a 1975 thriller film directed by Steven "
    "Spielberg.</information>\n"
    "<search>Steven Spielberg born</search>\n"
    "<information>[Steven Spielberg] Steven Spielberg was born in Cincinnati, "
    "Ohio.</information>\n"
    "<answer>Cincinnati</answer>\n\n"
    "Question: {question}"
)


def search_prompt(question: str, max_calls: int = 5) -> str:
    return PROMPT.format(question=question.strip(), max_calls=max_calls)


def load_hotpotqa_rows(path: str, split: str, max_calls: int = 5) -> list[dict]:
    """Rows from HotpotQA-style records ``{question, answer, ...}``."""
    rows = []
    for i, rec in enumerate(read_records(path, split)):
        if "question" not in rec or "answer" not in rec:
            raise ValueError(
                f"HotpotQA record {i} lacks 'question' or 'answer': {sorted(rec)}"
            )
        rows.append(
            {
                "id": str(rec.get("id", f"hotpotqa-{i}")),
                "question": rec["question"],
                "answer": str(rec["answer"]),
                "messages": [
                    {
                        "role": "user",
                        "content": search_prompt(rec["question"], max_calls),
                    }
                ],
            }
        )
    return rows


# -- scoring ----------------------------------------------------------------------
def normalize_answer(s: str) -> str:
    """HotpotQA/SQuAD normalization: lowercase, no punctuation, articles or extra
    whitespace."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1_score(prediction: str, gold: str) -> float:
    """Token F1 as in HotpotQA's eval (yes/no/noanswer must match exactly)."""
    pred, ref = normalize_answer(prediction), normalize_answer(gold)
    special = ("yes", "no", "noanswer")
    if (pred in special or ref in special) and pred != ref:
        return 0.0
    pred_toks, ref_toks = pred.split(), ref.split()
    common = Counter(pred_toks) & Counter(ref_toks)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_toks), same / len(ref_toks)
    return 2 * precision * recall / (precision + recall)


def extract_answer(text: str) -> str | None:
    """The last closed ``<answer>...</answer>`` in ``text``, or None."""
    end = text.rfind(ANSWER_CLOSE)
    if end == -1:
        return None
    start = text.rfind(ANSWER_OPEN, 0, end)
    if start == -1:
        return None
    return text[start + len(ANSWER_OPEN) : end].strip()


def qa_em_reward_fn(
    prompt: str,
    completions: str,
    prompt_ids: list[int] | None = None,
    completion_ids: list[int] | None = None,
    answer: object = None,
    **kwargs,
) -> float:
    """Exact match of the last ``<answer>`` against the reference (0 if none)."""
    got = extract_answer(completions)
    return 0.0 if got is None or answer is None else exact_match(got, str(answer))


def qa_f1_reward_fn(
    prompt: str,
    completions: str,
    prompt_ids: list[int] | None = None,
    completion_ids: list[int] | None = None,
    answer: object = None,
    **kwargs,
) -> float:
    """Token F1 of the last ``<answer>`` against the reference (0 if none)."""
    got = extract_answer(completions)
    return 0.0 if got is None or answer is None else f1_score(got, str(answer))


SCORER_REWARD_FNS = {
    "em": "areal_marlaas.tasks.search.qa_em_reward_fn",
    "f1": "areal_marlaas.tasks.search.qa_f1_reward_fn",
}


# -- retrieval ----------------------------------------------------------------------
# BM25Index, Passage and format_passages live in areal_marlaas.tools.bm25 (no AReaL
# import, so the search server starts fast) and are re-exported here.
_INDEXES: dict[str, BM25Index] = {}
_INDEX_LOCK = threading.Lock()


def get_index(corpus_path: str | Path) -> BM25Index:
    """The BM25 index of ``corpus_path``, built once per process."""
    key = str(Path(corpus_path).expanduser().resolve())
    with _INDEX_LOCK:
        index = _INDEXES.get(key)
        if index is None:
            if not Path(key).is_file():
                raise FileNotFoundError(f"search corpus {key} does not exist")
            index = BM25Index.from_jsonl(key)
            _INDEXES[key] = index
            logger.info(f"BM25 index of {key}: {len(index.docs)} passages")
        return index
