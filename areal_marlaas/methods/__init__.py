"""Training methods: what a task's steps optimize and where their batches come
from. ``grpo`` rolls out on the shared server and trains on a verifiable
reward; ``sft`` trains on its dataset's demonstrations and ``dpo`` on its
preference pairs (no rollout: their batches go straight to the train queue)."""

from __future__ import annotations

from enum import StrEnum


class Method(StrEnum):
    """``tasks[].method`` (a job's ``method.type``: reinforcement = grpo,
    supervised = sft, dpo = dpo)."""

    GRPO = "grpo"
    SFT = "sft"
    DPO = "dpo"

    @property
    def rolls_out(self) -> bool:
        """Whether its batches are generated on the rollout server (the others
        train on their dataset's examples: ``methods.examples``)."""
        return self is Method.GRPO


METHODS = tuple(m.value for m in Method)
