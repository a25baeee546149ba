"""Competition math (AMC, MATH): problems with a final answer, scored by
math equivalence through AReaL's math-verify worker."""

from __future__ import annotations

from areal.utils import logging

from areal_marlaas.tasks.records import read_records
from areal_marlaas.tasks.rewards import _boxed_contents

logger = logging.getLogger("MARLaaSMathReward")

PROMPT_SUFFIX = (
    "\nThink step by step, then put the final answer in \\boxed{}, "
    "for example \\boxed{42}."
)


def reference_answer(rec: dict) -> str:
    """``answer`` when present (AMC floats like 142.0 become "142"), else the last
    ``\\boxed{}`` of ``solution``."""
    ans = rec.get("answer")
    if isinstance(ans, float) and ans.is_integer():
        return str(int(ans))
    if ans is not None and str(ans).strip():
        return str(ans).strip()
    boxed = _boxed_contents(str(rec.get("solution", "")))
    if not boxed:
        raise ValueError("record has neither 'answer' nor a \\boxed{} solution")
    return boxed[-1].strip()


def load_math_rows(path: str, split: str, prefix: str) -> list[dict]:
    """Rows from ``{problem, answer | solution}`` records (.json array or .jsonl);
    records without a reference answer are skipped (MATH train has a few)."""
    rows, skipped = [], 0
    for i, rec in enumerate(read_records(path, split)):
        if "problem" not in rec:
            raise ValueError(f"{prefix} record {i} lacks 'problem': {sorted(rec)}")
        try:
            answer = reference_answer(rec)
        except ValueError:
            skipped += 1
            continue
        rows.append(
            {
                "id": str(rec.get("unique_id", f"{prefix}-{i}")),
                "question": rec["problem"],
                "answer": answer,
                "messages": [
                    {"role": "user", "content": rec["problem"] + PROMPT_SUFFIX}
                ],
            }
        )
    if skipped:
        logger.warning(f"{path}: skipped {skipped} {prefix} records with no answer")
    return rows


def _as_gold(answer: str) -> str:
    # math-verify's LaTeX extraction needs delimiters around a bare reference.
    return answer if "\\boxed" in answer else f"\\boxed{{{answer}}}"


def math_verify_reward_fn(
    prompt: str,
    completions: str,
    prompt_ids: list[int] | None = None,
    completion_ids: list[int] | None = None,
    answer: object = None,
    **kwargs,
) -> float:
    """1.0 when the completion's final answer is mathematically equal to the
    reference (``\\frac{1}{2}`` = 0.5, ``\\boxed{142}`` = 142.0), else 0.0."""
    from areal.reward import get_math_verify_worker

    if answer is None:
        return 0.0
    if isinstance(answer, float) and answer.is_integer():
        answer = int(answer)
    boxed = _boxed_contents(completions)
    # The last \boxed{} is the model's final answer; without one, math-verify
    # falls back to the last expression in the text.
    pred = f"\\boxed{{{boxed[-1]}}}" if boxed else completions
    try:
        return get_math_verify_worker().verify(pred, _as_gold(str(answer)))
    except Exception:  # math-verify raises many types on odd LaTeX
        logger.warning("math-verify failed; scoring 0", exc_info=True)
        return 0.0
