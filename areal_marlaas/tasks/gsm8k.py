"""GSM8K: grade-school math word problems whose solutions end in ``#### N``."""

from __future__ import annotations

from areal_marlaas.tasks.records import read_records

PROMPT_SUFFIX = "\nGive the final answer as a number after '####'."


def _row(i: int, rec: dict) -> dict:
    if "question" not in rec or "answer" not in rec:
        raise ValueError(
            f"GSM8K record {i} lacks 'question' or 'answer': {sorted(rec)}"
        )
    return {
        "id": f"gsm8k-{i}",
        "question": rec["question"],
        "answer": rec["answer"],
        "messages": [{"role": "user", "content": rec["question"] + PROMPT_SUFFIX}],
    }


def load_gsm8k_rows(path: str, split: str) -> list[dict]:
    """Rows from a jsonl file, a folder holding ``<split>.jsonl``, or a hub id."""
    return [_row(i, rec) for i, rec in enumerate(read_records(path, split, "main"))]
