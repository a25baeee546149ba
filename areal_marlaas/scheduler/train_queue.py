"""The training queue: batches whose rollout finished, in the order trainers take
them (``scheduler.train_order``).

One class per order behind ``create_train_queue``, so the core never branches on
the order and a new one is a class plus a ``TrainOrder`` member. The core calls:

* ``add(batch)`` when a task's rollout finished (its batch waits for a trainer);
* ``remove(task)`` when the batch goes to a trainer, or is dropped because its
  task failed, errored or was cancelled;
* iteration when a trainer may be free: the queued tasks in the order trainers
  take them. A trainer takes the first batch that may run on it, so the core
  walks on past a batch whose round or trainer is not ready. The core does not
  change the queue while it iterates.

Every operation but iteration is O(1).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from enum import StrEnum
from itertools import chain
from typing import Protocol


class TrainOrder(StrEnum):
    """``scheduler.train_order``: which queued batch a free trainer takes."""

    FIFO = "fifo"  # in the order their rollouts finished
    # A task's first batch since it was submitted ahead of the others (FIFO
    # within each class): a newcomer waits for at most the batch in training and
    # the other newcomers' first batches.
    FIRST_STEPS = "first_steps"


TRAIN_ORDERS = tuple(o.value for o in TrainOrder)


class QueuedBatch(Protocol):
    """What a queue may read of the task whose batch it holds."""

    name: str
    version: int  # the version its batch was generated with
    start_version: int  # the version it was submitted at


class TrainQueue(ABC):
    """Tasks whose batch waits for a trainer (one batch per task)."""

    @abstractmethod
    def add(self, batch: QueuedBatch) -> None: ...

    @abstractmethod
    def remove(self, task: str) -> None:
        """Take ``task``'s batch out (KeyError when it holds none)."""

    @abstractmethod
    def __iter__(self) -> Iterator[str]:
        """The queued tasks, in the order trainers take them."""

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def __contains__(self, task: object) -> bool: ...

    def discard(self, task: str) -> None:
        if task in self:
            self.remove(task)


class FIFOTrainQueue(TrainQueue):
    """In the order the rollouts finished."""

    def __init__(self) -> None:
        self._tasks: dict[str, None] = {}  # insertion-ordered set

    def add(self, batch: QueuedBatch) -> None:
        self._tasks[batch.name] = None

    def remove(self, task: str) -> None:
        del self._tasks[task]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tasks)

    def __len__(self) -> int:
        return len(self._tasks)

    def __contains__(self, task: object) -> bool:
        return task in self._tasks


class FirstStepsTrainQueue(TrainQueue):
    """First batches since submission ahead of the others, FIFO within each.
    A task's version does not change while its batch is queued, so its class is
    fixed when it is added."""

    def __init__(self) -> None:
        self._first: dict[str, None] = {}
        self._rest: dict[str, None] = {}

    def add(self, batch: QueuedBatch) -> None:
        first = batch.version == batch.start_version
        (self._first if first else self._rest)[batch.name] = None

    def remove(self, task: str) -> None:
        if task in self._first:
            del self._first[task]
        else:
            del self._rest[task]

    def __iter__(self) -> Iterator[str]:
        return chain(self._first, self._rest)

    def __len__(self) -> int:
        return len(self._first) + len(self._rest)

    def __contains__(self, task: object) -> bool:
        return task in self._first or task in self._rest


_QUEUES: dict[TrainOrder, type[TrainQueue]] = {
    TrainOrder.FIFO: FIFOTrainQueue,
    TrainOrder.FIRST_STEPS: FirstStepsTrainQueue,
}


def create_train_queue(order: TrainOrder | str) -> TrainQueue:
    """An empty queue for ``order`` (ValueError for an unknown one)."""
    try:
        return _QUEUES[TrainOrder(order)]()
    except ValueError:
        raise ValueError(
            f"train_order must be one of {TRAIN_ORDERS}, got {order!r}"
        ) from None
