"""Rows that are chat prompts already: ``{"messages": [...], <fields>}`` lines (the
OpenAI fine-tuning format of a job's training file). The fields go to the reward
as keyword arguments and to graders as ``item``."""

from __future__ import annotations

from areal_marlaas.tasks.records import read_records

ROLES = ("system", "developer", "user", "assistant", "tool")


def check_messages_row(row: object, where: str) -> None:
    """Raise ``ValueError`` naming ``where`` unless ``row`` is a chat prompt that
    ends with a user turn."""
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
    messages = row.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"{where}: needs a non-empty 'messages' list")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise ValueError(f"{where}: messages[{i}] needs a role in {list(ROLES)}")
        content = m.get("content")
        if not isinstance(content, str) and not (
            content is None and m.get("tool_calls")
        ):
            raise ValueError(
                f"{where}: messages[{i}].content must be a string (null only "
                "beside tool_calls)"
            )
    if messages[-1]["role"] != "user":
        raise ValueError(
            f"{where}: the last message must be the user's turn (the prompt the "
            "model answers), got role {messages[-1]['role']!r}"
        )


def load_messages_rows(path: str, split: str = "train") -> list[dict]:
    rows = read_records(path, split)
    for n, row in enumerate(rows, 1):
        check_messages_row(row, f"{path}:{n}")
    return rows
