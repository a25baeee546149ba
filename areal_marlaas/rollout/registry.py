"""Which adapter version each task generates with, and which names are in use.

A request leases its task's *current* adapter name for its whole life (including
AReaL's re-sends after an abort), so publishing ``<task>-v<N+1>`` never changes the
weights under a request that started on ``v<N>``; the old name is unloaded only once
its last lease is released. Thread-safe: the rollout event loop leases while the
trainer's thread publishes.

The version itself is owned by the trainer (``train_task`` returns it); this
registry only knows what was published to the server and from which folder.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from contextlib import contextmanager
from typing import Protocol

from areal_marlaas.adapters import adapter_name

__all__ = ["AdapterRegistry", "RegistryListener", "adapter_name"]


class RegistryListener(Protocol):
    """Observes the registry (audits, tests): every call happens under its lock."""

    def leased(self, name: str, start: float) -> None: ...

    def released(self, name: str, end: float) -> None: ...

    def published(self, name: str, at: float) -> None: ...

    def retired(self, name: str, at: float) -> None: ...


class AdapterRegistry:
    def __init__(self, listener: RegistryListener | None = None):
        self._cv = threading.Condition()
        self._current: dict[str, tuple[int, str]] = {}  # task -> (version, folder)
        self._inflight: Counter[str] = Counter()
        self._retiring: set[str] = set()
        self.listener = listener

    def served(self) -> dict[str, tuple[int, str]]:
        """Every task's published version and the folder it was loaded from."""
        with self._cv:
            return dict(self._current)

    def has(self, task: str) -> bool:
        with self._cv:
            return task in self._current

    def version(self, task: str) -> int:
        with self._cv:
            if task not in self._current:
                raise KeyError(f"task {task!r} has no adapter loaded")
            return self._current[task][0]

    def set_current(self, task: str, version: int, path: str = "") -> str | None:
        """Make ``version`` the one new requests use; returns the name it replaces."""
        with self._cv:
            old = self._current.get(task)
            self._current[task] = (version, str(path))
            if self.listener is not None:
                self.listener.published(adapter_name(task, version), time.time())
            if old is None or old[0] == version:
                return None
            old_name = adapter_name(task, old[0])
            self._retiring.add(old_name)
            return old_name

    def forget(self, task: str) -> str | None:
        """Stop serving ``task`` (it left); returns its name, now retiring."""
        with self._cv:
            old = self._current.pop(task, None)
            if old is None:
                return None
            name = adapter_name(task, old[0])
            self._retiring.add(name)
            return name

    @contextmanager
    def lease(self, task: str):
        """Pin the task's current version for one request."""
        with self._cv:
            if task not in self._current:
                raise KeyError(
                    f"no adapter for task {task!r}: "
                    f"load_adapter({task!r}, 0, path) first"
                )
            version = self._current[task][0]
            name = adapter_name(task, version)
            self._inflight[name] += 1
            if self.listener is not None:
                self.listener.leased(name, time.time())
        try:
            yield version
        finally:
            with self._cv:
                self._inflight[name] -= 1
                if self.listener is not None:
                    self.listener.released(name, time.time())
                if self._inflight[name] == 0:
                    del self._inflight[name]
                    self._cv.notify_all()

    def wait_drained(self, name: str, timeout: float | None = None) -> bool:
        with self._cv:
            return self._cv.wait_for(lambda: self._inflight[name] == 0, timeout)

    def mark_retired(self, name: str) -> None:
        with self._cv:
            self._retiring.discard(name)
            if self.listener is not None:
                self.listener.retired(name, time.time())

    def retiring(self) -> set[str]:
        with self._cv:
            return set(self._retiring)
