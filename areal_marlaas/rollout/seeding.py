"""Reproducible sampling: one vLLM seed per request, derived from what the request is.

A request's seed is a hash of (task seed, task, adapter version, prompt tokens,
occurrence), where the occurrence counts earlier requests of the same task,
version and prompt in this process (the samples of one prompt's group). A run
that is restarted from a committed version therefore sends the same seeds as an
uninterrupted run did, whatever else the server is batching: vLLM draws a seeded
request's tokens from its own generator, so its tokens do not depend on the batch.

Workflows opt in with ``seeded_sampling(seed)`` around an episode; the engine
derives the request seeds inside it (``RequestSeeds``) and the backend adds them
to the payload.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import threading
from collections.abc import Iterator, Sequence

# The task seed of the episode running in this asyncio task (None = unseeded).
_TASK_SEED: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "marlaas_task_seed", default=None
)
# The seed of the request being built (set by the engine, read by the backend).
_REQUEST_SEED: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "marlaas_request_seed", default=None
)
# vLLM's OpenAI server takes a signed 64-bit seed.
_SEED_MASK = (1 << 63) - 1


@contextlib.contextmanager
def _bound(var: contextvars.ContextVar, value: int | None) -> Iterator[None]:
    token = var.set(value)
    try:
        yield
    finally:
        var.reset(token)


def seeded_sampling(seed: int | None) -> contextlib.AbstractContextManager[None]:
    """Seed the requests of the episode run inside (``None``: leave unseeded)."""
    return _bound(_TASK_SEED, seed)


def task_seed() -> int | None:
    return _TASK_SEED.get()


def request_seed(seed: int | None) -> contextlib.AbstractContextManager[None]:
    return _bound(_REQUEST_SEED, seed)


def current_request_seed() -> int | None:
    return _REQUEST_SEED.get()


class RequestSeeds:
    """Per-request seeds for one engine; thread-safe.

    Occurrence counters are kept only for each task's newest version: an
    on-policy task never samples an older version again.
    """

    def __init__(self) -> None:
        self._counts: dict[tuple[str, int, bytes], int] = {}
        self._newest: dict[str, int] = {}
        self._lock = threading.Lock()

    def next(self, task: str, version: int, input_ids: Sequence[int]) -> int | None:
        """The seed of the next request of ``task`` at ``version`` on this prompt,
        or None outside ``seeded_sampling``."""
        base = task_seed()
        if base is None:
            return None
        prompt = hashlib.sha256(
            f"{base}:{task}:{version}:".encode()
            + b",".join(str(int(t)).encode() for t in input_ids)
        ).digest()
        key = (task, version, prompt)
        with self._lock:
            if version > self._newest.get(task, -1):
                self._newest[task] = version
                for old in [k for k in self._counts if k[0] == task]:
                    del self._counts[old]
            k = self._counts.get(key, 0)
            self._counts[key] = k + 1
        digest = hashlib.sha256(prompt + k.to_bytes(8, "little")).digest()
        return int.from_bytes(digest[:8], "little") & _SEED_MASK
