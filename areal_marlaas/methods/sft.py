"""Supervised fine-tuning rows: OpenAI's chat format, checked and tokenized.

A row is ``{"messages": [...], "tools": [...]?}`` ending with the assistant's
turn; the loss reads the assistant turns whose ``weight`` is 1 (the default),
each with the tokens the chat template closes it with, so the model learns to
stop. Rendering is the one the rollout server and the RL workflows use
(``agents.protocol.prompt_messages``: a tools section in the system message,
demonstrated calls as Hermes text), so what SFT teaches is what they serve.
"""

from __future__ import annotations

import torch
from areal.utils.hf_utils import apply_chat_template

from areal_marlaas.agents.protocol import calls_as_text, prompt_messages
from areal_marlaas.tasks.messages import ROLES


def check_sft_row(row: object, where: str) -> None:
    """Raise ``ValueError`` naming ``where`` and the field unless ``row`` is a
    supervised example."""
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
    messages = row.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"{where}: needs a non-empty 'messages' list")
    trained = 0
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ValueError(f"{where}: messages[{i}] must be an object")
        role = m.get("role")
        if not role or role not in ROLES:
            raise ValueError(
                f"{where}: messages[{i}].role must be one of {list(ROLES)}, got "
                f"{role!r}"
            )
        content = m.get("content")
        if not isinstance(content, str) and not (
            content is None and role == "assistant" and m.get("tool_calls")
        ):
            raise ValueError(
                f"{where}: messages[{i}].content must be a string (null only "
                "beside an assistant's tool_calls)"
            )
        if "weight" in m:
            if role != "assistant":
                raise ValueError(
                    f"{where}: messages[{i}].weight is allowed on assistant "
                    "messages only"
                )
            if m["weight"] not in (0, 1) or isinstance(m["weight"], bool):
                raise ValueError(
                    f"{where}: messages[{i}].weight must be 0 or 1, got {m['weight']!r}"
                )
        if role == "assistant" and m.get("weight", 1) == 1:
            trained += 1
    if messages[-1].get("role") != "assistant":
        raise ValueError(
            f"{where}: the last message must be the assistant's turn (the "
            f"demonstration to learn), got role {messages[-1].get('role')!r}"
        )
    if not trained:
        raise ValueError(
            f"{where}: every assistant message has weight 0: nothing to learn"
        )
    tools = row.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise ValueError(f"{where}: tools must be a list of function definitions")


def _rendered(row: dict) -> list[dict]:
    messages = prompt_messages(row)
    # Calls as text also without a tools section; weights are ours, not the
    # template's.
    return [
        {k: v for k, v in calls_as_text(m).items() if k != "weight"} for m in messages
    ]


def sft_example(
    tokenizer, row: dict, max_tokens: int, where: str = "row"
) -> dict[str, torch.Tensor]:
    """One training sequence: ``input_ids``, ``attention_mask`` and
    ``loss_mask`` (1 on the trained assistant turns' tokens), each ``[1, L]``.

    Raises ``ValueError`` when it is longer than ``max_tokens`` or the chat
    template does not render the conversation as a growing prefix."""
    raw = row["messages"]
    messages = _rendered(row)
    # The rendering may add a system message in front (the tools section).
    offset = len(messages) - len(raw)
    ids: list[int] = []
    mask: list[int] = []
    for i, m in enumerate(raw):
        if m.get("role") != "assistant":
            continue
        head = apply_chat_template(
            tokenizer,
            messages[: offset + i],
            tokenize=True,
            add_generation_prompt=True,
        )
        full = apply_chat_template(tokenizer, messages[: offset + i + 1], tokenize=True)
        if full[: len(head)] != head or head[: len(ids)] != ids:
            raise ValueError(
                f"{where}: the chat template does not render messages[{i}] after "
                "the turns before it; it cannot be trained turn by turn"
            )
        mask += [0] * (len(head) - len(ids))
        mask += [int(m.get("weight", 1))] * (len(full) - len(head))
        ids = list(full)
    if len(ids) > max_tokens:
        raise ValueError(
            f"{where}: {len(ids)} tokens, over the model's limit of {max_tokens} "
            "(shorten the conversation or split it)"
        )
    n = len(ids)
    return {
        "input_ids": torch.tensor([ids], dtype=torch.long),
        "attention_mask": torch.ones(1, n, dtype=torch.bool),
        "loss_mask": torch.tensor([mask], dtype=torch.long),
    }
