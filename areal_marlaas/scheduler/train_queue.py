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
  change the queue while it iterates;
* ``started(batch)`` when its batch went to a trainer (after ``remove``),
  ``finished(batch, seconds)`` when that step committed and ``aborted(batch)``
  when it failed: what a fair order charges (the others ignore them).

Every operation of ``fifo`` and ``first_steps`` but iteration is O(1); ``fair``
is O(log tenants) per operation and O(queued log tenants) per iteration.
"""

from __future__ import annotations

import heapq
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
    # Weighted fair share of trainer time between tenants (virtual time: each
    # tenant's trainer-seconds / weight, the lowest next; a tenant that becomes
    # backlogged is lifted to the backlogged minimum); FIFO within a tenant.
    FAIR = "fair"


TRAIN_ORDERS = tuple(o.value for o in TrainOrder)


class QueuedBatch(Protocol):
    """What a queue may read of the task whose batch it holds."""

    name: str
    version: int  # the version its batch was generated with
    start_version: int  # the version it was submitted at
    tenant: str  # whose share its steps count toward ("": its own name)
    weight: float  # the tenant's weight (> 0)


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

    # What a fair order charges; the other orders need none of it.
    def started(self, batch: QueuedBatch) -> None:  # noqa: B027 (optional hook)
        """``batch`` went to a trainer (it was removed first)."""

    def finished(self, batch: QueuedBatch, seconds: float | None) -> None:  # noqa: B027
        """The step of a started batch committed after ``seconds`` of training."""

    def aborted(self, batch: QueuedBatch) -> None:  # noqa: B027
        """The step of a started batch failed or was dropped."""


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


def tenant_of(batch: QueuedBatch) -> str:
    return batch.tenant or batch.name


class FairTrainQueue(TrainQueue):
    """Weighted fair queuing of trainer time between tenants, after VTC (Sheng
    et al., OSDI '24) with trainer-seconds as the service.

    Each tenant has a virtual time ``vtime`` = its charged trainer-seconds /
    weight. A step is charged when it ends (its measured seconds); until then
    its estimate (its task's last measured step, else the tenant's, else the
    mean of all) counts as in flight, so a second trainer does not pick the
    same tenant twice for one charge. Trainers take the tenant with the lowest
    ``vtime + in-flight``, its batches in FIFO order. A tenant that becomes
    backlogged (nothing queued or training before) is lifted to the lowest
    backlogged ``vtime`` (with none, to the last dispatched one), so idle time
    banks no credit. Non-preemptive: a step of any tenant may run ahead of a
    lower one, which bounds how far two backlogged tenants' weighted service
    drift apart by (trainers + 1) x the largest step cost / weight."""

    def __init__(self) -> None:
        self._batches: dict[str, QueuedBatch] = {}  # task -> batch, FIFO
        self._by_tenant: dict[str, dict[str, None]] = {}  # tenant -> its tasks
        self.vtime: dict[str, float] = {}
        self._flight: dict[str, float] = {}  # tenant -> estimates in training
        self._training: dict[str, int] = {}  # tenant -> its steps in training
        self._running: dict[str, float] = {}  # task in training -> its estimate
        self._floor = 0.0  # the key of the last dispatched tenant
        self._step_s: dict[str, float] = {}  # task -> its last measured step
        self._tenant_s: dict[str, float] = {}  # tenant -> its last measured step
        self._all_s = (0.0, 0)  # sum and count of measured steps

    # -- estimates ---------------------------------------------------------------
    def estimate(self, batch: QueuedBatch) -> float:
        """Trainer-seconds one step of ``batch``'s task is expected to take."""
        s = self._step_s.get(batch.name)
        if s is None:
            s = self._tenant_s.get(tenant_of(batch))
        if s is None:
            total, n = self._all_s
            s = total / n if n else 1.0
        return s

    def _key(self, tenant: str) -> float:
        return self.vtime.get(tenant, 0.0) + self._flight.get(tenant, 0.0)

    def _backlogged(self, tenant: str) -> bool:
        return tenant in self._by_tenant or tenant in self._training

    # -- the queue -----------------------------------------------------------------
    def add(self, batch: QueuedBatch) -> None:
        tenant = tenant_of(batch)  # its weight is > 0: the core checked it
        if not self._backlogged(tenant):
            others = [
                self.vtime.get(t, 0.0)
                for t in {*self._by_tenant, *self._training}
                if t != tenant
            ]
            lift = min(others) if others else self._floor
            self.vtime[tenant] = max(self.vtime.get(tenant, 0.0), lift)
        self._batches[batch.name] = batch
        self._by_tenant.setdefault(tenant, {})[batch.name] = None

    def remove(self, task: str) -> None:
        batch = self._batches.pop(task)
        tenant = tenant_of(batch)
        del self._by_tenant[tenant][task]
        if not self._by_tenant[tenant]:
            del self._by_tenant[tenant]

    def __iter__(self) -> Iterator[str]:
        # The order trainers would take them one after another: each batch
        # taken adds its estimate to its tenant's key before the next pick.
        heap = []
        for i, (tenant, tasks) in enumerate(self._by_tenant.items()):
            heap.append((self._key(tenant), i, tenant, list(tasks)))
        heapq.heapify(heap)
        while heap:
            key, i, tenant, tasks = heapq.heappop(heap)
            task = tasks.pop(0)
            yield task
            if tasks:
                batch = self._batches[task]
                step = self.estimate(batch) / batch.weight
                heapq.heappush(heap, (key + step, i, tenant, tasks))

    def __len__(self) -> int:
        return len(self._batches)

    def __contains__(self, task: object) -> bool:
        return task in self._batches

    # -- charging ------------------------------------------------------------------
    def started(self, batch: QueuedBatch) -> None:
        tenant = tenant_of(batch)
        self._floor = max(self._floor, self._key(tenant))
        est = self.estimate(batch) / batch.weight
        self._running[batch.name] = est
        self._flight[tenant] = self._flight.get(tenant, 0.0) + est
        self._training[tenant] = self._training.get(tenant, 0) + 1

    def finished(self, batch: QueuedBatch, seconds: float | None) -> None:
        est = self._end(batch)
        if seconds is None:
            charge = est
        else:
            charge = seconds / batch.weight
            self._step_s[batch.name] = seconds
            self._tenant_s[tenant_of(batch)] = seconds
            total, n = self._all_s
            self._all_s = (total + seconds, n + 1)
        tenant = tenant_of(batch)
        self.vtime[tenant] = self.vtime.get(tenant, 0.0) + charge

    def aborted(self, batch: QueuedBatch) -> None:
        self._end(batch)

    def _end(self, batch: QueuedBatch) -> float:
        est = self._running.pop(batch.name)
        tenant = tenant_of(batch)
        self._training[tenant] -= 1
        if self._training[tenant]:
            self._flight[tenant] -= est
        else:
            del self._training[tenant], self._flight[tenant]
        return est


_QUEUES: dict[TrainOrder, type[TrainQueue]] = {
    TrainOrder.FIFO: FIFOTrainQueue,
    TrainOrder.FIRST_STEPS: FirstStepsTrainQueue,
    TrainOrder.FAIR: FairTrainQueue,
}


def create_train_queue(order: TrainOrder | str) -> TrainQueue:
    """An empty queue for ``order`` (ValueError for an unknown one)."""
    try:
        return _QUEUES[TrainOrder(order)]()
    except ValueError:
        raise ValueError(
            f"train_order must be one of {TRAIN_ORDERS}, got {order!r}"
        ) from None
