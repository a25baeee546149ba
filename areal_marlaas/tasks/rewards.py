"""Verifiable rewards on a final numeric answer.

Reward functions follow AReaL's convention ``fn(prompt, completions, prompt_ids,
completion_ids, **row) -> float`` and are module-level so AReaL's process-pool reward
wrapper can pickle them.
"""

from __future__ import annotations

import re
from fractions import Fraction

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")
_ANSWER_PHRASE = re.compile(
    r"(?:final answer|the answer|answer)\s*(?:is|:|=)?\s*[:=]?\s*([^\n]*)", re.I
)


def _boxed_contents(text: str) -> list[str]:
    """Contents of every ``\\boxed{...}``, with nested braces balanced."""
    out = []
    start = 0
    while (i := text.find("\\boxed", start)) != -1:
        j = text.find("{", i)
        if j == -1:
            break
        depth, k = 0, j
        while k < len(text):
            if text[k] == "{":
                depth += 1
            elif text[k] == "}":
                depth -= 1
                if depth == 0:
                    break
            k += 1
        out.append(text[j + 1 : k])
        start = k + 1
    return out


def parse_number(text: str) -> Fraction | None:
    """The last number in ``text`` (commas, ``$``, ``%`` and units ignored)."""
    cleaned = text.replace("\\!", "").replace("{,}", ",").replace("\\$", "$")
    cleaned = re.sub(r"\\frac\{(-?\d+)\}\{(\d+)\}", r"\1/\2", cleaned)
    matches = _NUMBER.findall(cleaned)
    if not matches:
        return None
    raw = matches[-1].replace(",", "")
    try:
        return Fraction(raw)
    except (ValueError, ZeroDivisionError):
        return None


def extract_final_answer(completion: str) -> Fraction | None:
    """Find the model's final number: ``\\boxed{}``, then ``#### N``, then an
    "answer is N" phrase, then the last number in the text."""
    boxed = _boxed_contents(completion)
    if boxed:
        return parse_number(boxed[-1])
    if "####" in completion:
        got = parse_number(completion.rsplit("####", 1)[1].split("\n")[0])
        if got is not None:
            return got
    phrases = _ANSWER_PHRASE.findall(completion)
    for phrase in reversed(phrases):
        got = parse_number(phrase)
        if got is not None:
            return got
    return parse_number(completion)


def reference_number(answer: object) -> Fraction | None:
    """The reference answer as a number; GSM8K solutions end in ``#### N``."""
    if isinstance(answer, int | float):
        return Fraction(answer).limit_denominator(10**6)
    text = str(answer)
    if "####" in text:
        text = text.rsplit("####", 1)[1]
    return parse_number(text)


def numeric_answer_reward_fn(
    prompt: str,
    completions: str,
    prompt_ids: list[int] | None = None,
    completion_ids: list[int] | None = None,
    answer: object = None,
    **kwargs,
) -> float:
    """1.0 when the completion's final number equals the reference, else 0.0."""
    ref = reference_number(answer)
    got = extract_final_answer(completions)
    return float(ref is not None and got is not None and got == ref)
