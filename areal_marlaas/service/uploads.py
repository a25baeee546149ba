"""Checks on an uploaded training file before it is stored: UTF-8 JSONL, one JSON
object per line with a ``messages`` list that ends with a user turn (a prompt the
model completes, for reinforcement) or an assistant turn (a demonstration, for
supervised jobs), or a preference pair (``input.messages``, ``preferred_output``,
``non_preferred_output``: DPO jobs). Extra fields are kept: graders read them as
``item.*``. Which shape a job needs is checked when the job is created.
"""

from __future__ import annotations

import json
import unicodedata

ROLES = ("system", "developer", "user", "assistant", "tool")


class UploadError(ValueError):
    """A rejected upload; the message names the line and the problem."""


def sanitize_filename(name: str | None) -> str:
    """The uploaded name as display metadata only: no directories, no control
    characters, at most 255 characters. It never becomes a path on disk."""
    base = (name or "").replace("\\", "/").rsplit("/", 1)[-1]
    base = "".join(c for c in base if unicodedata.category(c)[0] != "C").strip()
    if base in ("", ".", ".."):
        base = "upload.jsonl"
    return base[:255]


def validate_training_jsonl(body: bytes) -> int:
    """The number of examples in ``body``; raises :class:`UploadError` at the first
    bad line (1-based line numbers; blank lines are skipped)."""
    if body.startswith(b"\xef\xbb\xbf"):
        body = body[3:]  # a UTF-8 byte-order mark is harmless
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        line = body[: e.start].count(b"\n") + 1
        raise UploadError(
            f"The file is not valid UTF-8: line {line} has an invalid byte at "
            f"offset {e.start}."
        ) from e
    examples = 0
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise UploadError(f"Line {number} is not valid JSON: {e.msg}.") from e
        _check_row(row, number)
        examples += 1
    if examples == 0:
        raise UploadError("The file has no examples (one JSON object per line).")
    return examples


def _check_row(row: object, n: int) -> None:
    if not isinstance(row, dict):
        raise UploadError(f"Line {n} must be a JSON object, got {_kind(row)}.")
    if "messages" not in row and "input" in row:
        _check_preference(row, n)
        return
    messages = row.get("messages")
    if not isinstance(messages, list) or not messages:
        raise UploadError(f"Line {n} needs 'messages', a non-empty list of turns.")
    _check_turns(messages, n, "messages")
    if messages[-1].get("role") not in ("user", "assistant"):
        raise UploadError(
            f"Line {n}: the last message must be a user turn (the prompt the model "
            "answers, for reinforcement) or an assistant turn (the demonstration, "
            f"for supervised), got {messages[-1].get('role')!r}."
        )


def _check_preference(row: dict, n: int) -> None:
    """A DPO line: ``input.messages`` and the two outputs (their rules per
    method are checked when a job uses the file)."""
    prompt = row.get("input")
    if not isinstance(prompt, dict) or not isinstance(prompt.get("messages"), list):
        raise UploadError(f"Line {n} needs 'input': an object with 'messages'.")
    _check_turns(prompt["messages"], n, "input.messages")
    for key in ("preferred_output", "non_preferred_output"):
        out = row.get(key)
        if out is None:
            continue  # a DPO job names what its lines lack
        if not isinstance(out, list):
            raise UploadError(f"Line {n}: '{key}' must be a list of messages.")
        _check_turns(out, n, key)


def _check_turns(messages: list, n: int, field: str) -> None:
    for i, msg in enumerate(messages):
        where = f"Line {n}, {field}[{i}]"
        if not isinstance(msg, dict):
            raise UploadError(f"{where} must be an object with role and content.")
        role = msg.get("role")
        if role not in ROLES:
            raise UploadError(
                f"{where} has role {role!r}; expected one of {list(ROLES)}."
            )
        content = msg.get("content")
        # An assistant turn that only calls tools (a demonstration) has none.
        if not _is_content(content) and not (
            content is None and role == "assistant" and msg.get("tool_calls")
        ):
            raise UploadError(
                f"{where} needs 'content': a string or a list of text parts "
                "(null only in an assistant turn with tool_calls)."
            )


def _is_content(content: object) -> bool:
    if isinstance(content, str):
        return True
    return (
        isinstance(content, list)
        and bool(content)
        and all(
            isinstance(p, dict)
            and p.get("type") == "text"
            and isinstance(p.get("text"), str)
            for p in content
        )
    )


def _kind(v: object) -> str:
    return {
        list: "an array",
        str: "a string",
        type(None): "null",
        bool: "a boolean",
    }.get(type(v), "a number")
