"""Which adapter version each task generates with, and which names are in use.

A request leases its task's *current* adapter name for its whole life (including
AReaL's re-sends after an abort), so publishing ``<task>-v<N+1>`` never changes the
weights under a request that started on ``v<N>``; the old name is unloaded only once
its last lease is released. Thread-safe: the rollout event loop leases while the
trainer's thread publishes.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass


def adapter_name(task: str, version: int) -> str:
    """The served model name of a task version (AReaL's ``get_versioned_lora_name``)."""
    return f"{task}-v{version}"


@dataclass
class LeaseRecord:
    """One request's use of an adapter: kept for auditing and tests."""

    name: str
    task: str
    version: int
    start: float
    end: float | None = None


class AdapterRegistry:
    def __init__(self, keep_records: int = 100_000):
        self._cv = threading.Condition()
        self._current: dict[str, int] = {}
        self._inflight: Counter[str] = Counter()
        self._retiring: set[str] = set()
        self._retired_at: dict[str, float] = {}
        self._published_at: dict[str, float] = {}
        self.records: list[LeaseRecord] = []
        self._keep = keep_records

    def tasks(self) -> dict[str, int]:
        with self._cv:
            return dict(self._current)

    def has(self, task: str) -> bool:
        with self._cv:
            return task in self._current

    def version(self, task: str) -> int:
        with self._cv:
            if task not in self._current:
                raise KeyError(f"task {task!r} has no adapter loaded")
            return self._current[task]

    def set_current(self, task: str, version: int) -> str | None:
        """Make ``version`` the one new requests use; returns the name it replaces."""
        with self._cv:
            old = self._current.get(task)
            self._current[task] = version
            self._published_at[adapter_name(task, version)] = time.time()
            if old is None or old == version:
                return None
            old_name = adapter_name(task, old)
            self._retiring.add(old_name)
            return old_name

    @contextmanager
    def lease(self, task: str):
        """Pin the task's current version for one request."""
        with self._cv:
            if task not in self._current:
                raise KeyError(
                    f"no adapter for task {task!r}: "
                    f"load_adapter({task!r}, 0, path) first"
                )
            version = self._current[task]
            name = adapter_name(task, version)
            self._inflight[name] += 1
            record = LeaseRecord(name, task, version, time.time())
            self.records.append(record)
            if len(self.records) > self._keep:
                del self.records[: len(self.records) - self._keep]
        try:
            yield version
        finally:
            with self._cv:
                record.end = time.time()
                self._inflight[name] -= 1
                if self._inflight[name] == 0:
                    del self._inflight[name]
                    self._cv.notify_all()

    def inflight(self, name: str) -> int:
        with self._cv:
            return self._inflight[name]

    def wait_drained(self, name: str, timeout: float | None = None) -> bool:
        with self._cv:
            return self._cv.wait_for(lambda: self._inflight[name] == 0, timeout)

    def published_at(self, name: str) -> float | None:
        """When ``name`` became the version new requests use."""
        with self._cv:
            return self._published_at.get(name)

    def mark_retired(self, name: str) -> None:
        with self._cv:
            self._retiring.discard(name)
            self._retired_at[name] = time.time()

    def retired_at(self, name: str) -> float | None:
        with self._cv:
            return self._retired_at.get(name)

    def retiring(self) -> set[str]:
        with self._cv:
            return set(self._retiring)
