"""The scheduling core's task states, and the table that keeps, as phases change,
the counts and orders the modes' decisions read: the core decides each event in
time that does not grow with the number of tasks it leaves alone."""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import Counter
from dataclasses import dataclass
from enum import StrEnum

from areal_marlaas.scheduler.events import HoldReason


class Phase(StrEnum):
    PENDING = "pending"  # waiting to roll out its current version
    ROLLOUT = "rollout"
    QUEUED = "queued"  # batch ready, waiting for a trainer
    TRAIN = "train"
    PUBLISH = "publish"
    PAUSED = "paused"  # stopped after a committed, published version
    EVAL = "eval"  # every step done; its last evals still running
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


_ENDED = (Phase.DONE, Phase.FAILED, Phase.CANCELLED)


class Stop(StrEnum):
    """A stop asked while a phase of the task was in flight."""

    NONE = ""
    PAUSE = "pause"  # after its current step is committed and published
    CANCEL = "cancel"  # when its phase returns


@dataclass
class TaskState:
    """One task in the core. Its phase, version and ``held`` change only through
    ``TaskTable.move`` (the table's counts follow them)."""

    name: str
    total_steps: int
    version: int = 0
    steps_done: int = 0
    start_version: int = 0  # the version it was submitted at
    phase: Phase = Phase.PENDING
    reason: str = ""
    kv_bytes: int = 0
    priority: int = 0
    order: int = 0
    errors: int = 0  # failures at the current version (reset by a commit)
    held: HoldReason | None = None  # why it waits, once a HoldRollout was emitted
    stop: Stop = Stop.NONE
    trainer: int | None = None  # see Submitted.trainer
    eval_every: int = 0  # see Submitted.eval_every
    eval_kv_bytes: int = 0
    evals: int = 0  # evals queued or running
    tenant: str = ""  # see Submitted.tenant ("" = its own name)
    weight: float = 1.0
    rollout: bool = True  # see Submitted.rollout

    @property
    def active(self) -> bool:
        return self.phase not in _ENDED

    @property
    def running(self) -> bool:
        """Whether the modes' turns and barriers wait for it (a paused task is
        left out until it resumes, a task whose evals alone remain for good)."""
        return self.phase not in (*_ENDED, Phase.PAUSED, Phase.EVAL)

    def eval_due(self, version: int) -> bool:
        return eval_due(version, self.eval_every, self.total_steps, self.start_version)

    @property
    def key(self) -> Key:
        """Admission order: priority first, then submission order."""
        return (-self.priority, self.order)


def eval_due(version: int, every: int, total: int, start: int = 0) -> bool:
    """Whether committed ``version`` gets an eval: every ``every``-th and the
    last (0: none); not the version a task was submitted (resumed) at."""
    if every <= 0 or version <= start:
        return False
    return version % every == 0 or version >= total


Key = tuple[int, int]
_SAME = object()  # move(): leave ``held`` as it is


def _remove(keys: list[Key], key: Key) -> None:
    i = bisect_left(keys, key)
    if i == len(keys) or keys[i] != key:
        raise KeyError(key)
    del keys[i]


class TaskTable:
    """Every task, plus what the admission and training decisions read of them,
    updated on each ``move`` by what the move changed (O(log n) each; the sorted
    lists only move pointers)."""

    def __init__(self) -> None:
        self.by_order: list[TaskState] = []  # a task's ``order`` is its index
        self.live = 0  # tasks not ended
        # Running tasks (see TaskState.running), sorted, and per version; of
        # those, per version: the ones publishing, the ones still to finish their
        # rollout (pending or rolling out) and the ones queued for a trainer.
        self.running: list[Key] = []
        self.versions: Counter[int] = Counter()
        self.publishing: Counter[int] = Counter()
        self.unrolled: Counter[int] = Counter()
        self.queued: Counter[int] = Counter()
        # Pending tasks, sorted; also per version and per hold reason.
        self.waiting: list[Key] = []
        self.waiting_at: dict[int, list[Key]] = {}
        self.waiting_held: dict[HoldReason | None, list[Key]] = {}
        self.rolling: dict[str, None] = {}  # rolling out now
        self.rolling_kv = 0

    def task(self, key: Key) -> TaskState:
        return self.by_order[key[1]]

    def add(self, task: TaskState) -> None:
        """A new task; its ``order`` must be the number of tasks before it."""
        if task.order != len(self.by_order):
            raise ValueError(f"task {task.name!r} has order {task.order}")
        self.by_order.append(task)
        for share in self._shares(task):
            self._apply(task, share, True)

    def move(
        self,
        task: TaskState,
        phase: Phase | None = None,
        version: int | None = None,
        held: HoldReason | None | object = _SAME,
    ) -> None:
        before = self._shares(task)
        if phase is not None:
            task.phase = phase
        if version is not None:
            task.version = version
        if held is not _SAME:
            task.held = held  # type: ignore[assignment]
        after = self._shares(task)
        for share in before - after:
            self._apply(task, share, False)
        for share in after - before:
            self._apply(task, share, True)

    @staticmethod
    def _shares(t: TaskState) -> set[tuple]:
        """What ``t`` counts in (its version: in the counts per version)."""
        if not t.active:
            return set()
        if t.phase in (Phase.PAUSED, Phase.EVAL):
            return {("live",)}  # no mode's turn or barrier waits for it
        v = t.version
        shares = {("live",), ("running",), ("version", v)}
        if t.phase is Phase.PUBLISH:
            shares.add(("publishing", v))
        elif t.phase is Phase.QUEUED:
            shares.add(("queued", v))
        elif t.phase is Phase.ROLLOUT:
            shares |= {("unrolled", v), ("rolling",)}
        elif t.phase is Phase.PENDING:
            shares |= {("unrolled", v), ("waiting",), ("waiting_at", v)}
            shares.add(("held", t.held))
        return shares

    def _apply(self, t: TaskState, share: tuple, add: bool) -> None:
        kind, step = share[0], 1 if add else -1
        if kind == "live":
            self.live += step
        elif kind == "rolling":
            if add:
                self.rolling[t.name] = None
            else:
                del self.rolling[t.name]
            self.rolling_kv += step * t.kv_bytes
        elif kind in ("version", "publishing", "unrolled", "queued"):
            counts = {
                "version": self.versions,
                "publishing": self.publishing,
                "unrolled": self.unrolled,
                "queued": self.queued,
            }[kind]
            counts[share[1]] += step
            if not counts[share[1]]:
                del counts[share[1]]
        else:  # a sorted list of keys
            if kind == "running":
                keys = self.running
            elif kind == "waiting":
                keys = self.waiting
            elif kind == "waiting_at":
                keys = self.waiting_at.setdefault(share[1], [])
            else:
                keys = self.waiting_held.setdefault(share[1], [])
            (insort if add else _remove)(keys, t.key)
            if kind == "waiting_at" and not keys:
                del self.waiting_at[share[1]]
