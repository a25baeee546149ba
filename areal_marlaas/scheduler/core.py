"""The MARLaaS scheduling core: a pure state machine (events in, actions out).

It knows nothing of threads, HTTP or tensors; the runtime drives it with real
rollouts and training, and the simulator drives it with modelled latencies.

Every mode keeps each task strictly on-policy: a task has at most one batch in
flight and never rolls out before its previous version is published. The modes
differ only in *when* a task may start a rollout or a training step:

* ``async`` (MARLaaS): every task loops
  ``rollout(v) -> queue -> train -> publish(v+1) -> rollout(v+1)`` on its own; tasks
  meet only in the FIFO training queue.
* ``sync`` (multi-LoRA synchronous): rounds. All tasks roll out version ``v``;
  training starts when the round's last rollout is done (barrier); each trains in
  turn; round ``v+1`` starts when every task has published (barrier). A task that
  arrives (or resumes) behind the others runs its earlier rounds alone until it
  catches up; the others' next round waits for it.
* ``sequential`` / ``collocated`` (single-task baselines): one task at a time runs
  all its steps; they differ only in placement, which the runtime sets.

A task submitted with ``rollout=False`` (supervised: its batches are its own
rows) never rolls out: each time it is ready its batch joins the training queue
at once, under the same train order and weights, past admission; a pause while
it waits there stops it at once. In sync mode it is one of the round's tasks;
in the single-task modes it trains in its turn.

Tasks may also arrive, pause, resume and be cancelled while others run (the job
service): ``Submitted`` at any time; ``Pause`` stops a task after its current
step is committed and published; ``Resume`` lets it roll out again; ``Cancel``
ends it at once when nothing of it is in flight, else when its phase returns.

Training order (one queue class per order, in ``train_queue``): ``fifo``
(default) trains batches in the order their rollouts finished. ``first_steps``
trains a task's first batch since it was submitted ahead of the others (FIFO
within each class): a tenant who just arrived waits for at most the batch in
training and the other newcomers' first batches, not for every running task's
next step. Each task jumps the queue once, so no batch waits behind more than
one first batch per task. ``fair`` shares trainer time between tenants by
weight (``Submitted.tenant``/``weight``; ``TrainDone.train_s`` is charged):
the tenant with the least weighted trainer time goes next, FIFO within it.

Rollout order (``rollout_share``): with ``rollout_order=fair`` each
``StartRollout`` carries the server priority of its requests, its tenant's
weighted generated tokens (``RolloutDone.tokens`` is charged), so a tenant's
huge batch does not hold back the others' rollouts; admission is unchanged.

Trainers: ``trainers`` steps may run at once, one per trainer. A task submitted
with a ``trainer`` trains only there (that trainer holds its weights and optimizer
state); a free trainer takes the first batch in the queue's order that may run on
it, so a batch whose trainer is busy lets the next one through to a free trainer.
A task has one batch at a time, so its steps stay in version order.

Admission: a task starts a rollout only while the KV footprint of the tasks rolling
out (or the server's reported usage, whichever is larger) plus its own stays within
``kv_budget``, and fewer than ``max_rolling`` tasks roll out. Waiting tasks go by
priority, then submission order, and a task that does not fit holds back those
behind it (no overtaking, so a large task is never starved). With
``concurrency=adaptive`` (async only) a task that has not rolled out since it was
submitted or resumed enters the loop only while the tasks in it offer the
trainers less than ``target_load`` x ``trainers`` (``concurrency.LoopLoad``);
it waits held ``load`` in admission order, the tasks in the loop pass it.

Evals: a task submitted with ``eval_every`` gets a ``StartEval`` after every
``eval_every``-th committed version is published, and after its last. An eval is
rollout-side work: it starts beside the task's next rollout (both use the version
just published, so training stays on-policy), never holds a train step, and its
KV counts against the budget while it runs; evals waiting for room go first, in
order, and rollouts do not overtake them. A task whose steps are all done
finishes when its last eval returns (``EvalDone``); an ended task's queued evals
are dropped.

Cost: the decisions read counts kept as phases change (``tasks.TaskTable``): the
running tasks per version, those publishing and those still to roll out; the
waiting tasks in admission order, per version and per hold reason. An admission
pass visits only the tasks it starts or whose hold reason changes, so an event
costs O(log n) for the tasks it leaves alone, plus a walk of the training queue
while a trainer is free (a thousand tenants: tens of thousands of events a
second).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum

from areal_marlaas.scheduler.concurrency import (
    CONCURRENCIES,
    Concurrency,
    LoopLoad,
)
from areal_marlaas.scheduler.events import (
    Action,
    Cancel,
    EvalDone,
    Event,
    FinishTask,
    HoldReason,
    HoldRollout,
    KVUsage,
    Pause,
    PublishDone,
    Resume,
    Reweight,
    RolloutDone,
    StartEval,
    StartPublish,
    StartRollout,
    StartTrain,
    Submitted,
    TaskError,
    TaskFailed,
    TaskPaused,
    TrainDone,
)
from areal_marlaas.scheduler.rollout_share import (
    ROLLOUT_ORDERS,
    RolloutOrder,
    RolloutShare,
)
from areal_marlaas.scheduler.tasks import Key, Phase, Stop, TaskState, TaskTable
from areal_marlaas.scheduler.train_queue import (
    TRAIN_ORDERS,
    TrainOrder,
    TrainQueue,
    create_train_queue,
)

__all__ = [
    "CONCURRENCIES",
    "MODES",
    "ROLLOUT_ORDERS",
    "TRAIN_ORDERS",
    "Action",
    "AdmissionError",
    "Cancel",
    "Concurrency",
    "EvalDone",
    "Event",
    "FinishTask",
    "HoldReason",
    "HoldRollout",
    "KVUsage",
    "Mode",
    "Pause",
    "Phase",
    "ProtocolError",
    "PublishDone",
    "Resume",
    "Reweight",
    "RolloutDone",
    "RolloutOrder",
    "SchedulerCore",
    "StartEval",
    "StartPublish",
    "StartRollout",
    "StartTrain",
    "Stop",
    "Submitted",
    "TaskError",
    "TaskFailed",
    "TaskPaused",
    "TaskState",
    "TrainDone",
    "TrainOrder",
]


class Mode(StrEnum):
    """``scheduler.mode`` (see the module docstring)."""

    ASYNC = "async"
    SYNC = "sync"
    SEQUENTIAL = "sequential"
    COLLOCATED = "collocated"


MODES = tuple(m.value for m in Mode)

# Why a task whose turn it is not waits, per mode (async: it is always its turn).
_TURN_HOLD = {
    Mode.SYNC: HoldReason.BARRIER,
    Mode.SEQUENTIAL: HoldReason.TURN,
    Mode.COLLOCATED: HoldReason.TURN,
}


class ProtocolError(RuntimeError):
    """An event that cannot happen in the task's current phase (a runtime bug)."""


class AdmissionError(ValueError):
    """A task whose rollout batch alone exceeds the KV budget: it could never run."""


@dataclass
class SchedulerCore:
    mode: Mode = Mode.ASYNC  # a Mode or its value
    kv_budget: int | None = None  # bytes; None = unlimited
    max_rolling: int | None = None  # tasks rolling out at once; None = unlimited
    trainers: int = 1  # trainers fed by the one queue
    task_retries: int = 0  # retries of a failed phase per version
    train_order: TrainOrder = TrainOrder.FIFO  # a TrainOrder or its value
    rollout_order: RolloutOrder = RolloutOrder.FIFO  # a RolloutOrder or its value
    concurrency: Concurrency = Concurrency.OFF  # a Concurrency or its value
    target_load: float = 1.0  # concurrency=adaptive: the loop's load x trainers
    tasks: dict[str, TaskState] = field(default_factory=dict, init=False)
    train_queue: TrainQueue = field(init=False)
    training: dict[str, int] = field(default_factory=dict, init=False)  # -> trainer
    live_kv: int = field(default=0, init=False)  # what the server last reported
    # Evals waiting for KV room, oldest first, and the KV of those running.
    eval_queue: deque[tuple[str, int]] = field(default_factory=deque, init=False)
    eval_kv: int = field(default=0, init=False)
    evals_running: dict[tuple[str, int], int] = field(default_factory=dict, init=False)
    table: TaskTable = field(default_factory=TaskTable, init=False, repr=False)
    # Tenants' shares of the server (rollout_order=fair), else None.
    rollout_share: RolloutShare | None = field(default=None, init=False, repr=False)
    # The tasks in the loop and their load (concurrency=adaptive), else None.
    loop: LoopLoad | None = field(default=None, init=False, repr=False)

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(
                f"scheduler mode must be one of {MODES}, got {self.mode!r}"
            )
        self.mode = Mode(self.mode)
        self.train_queue = create_train_queue(self.train_order)
        self.train_order = TrainOrder(self.train_order)
        if self.rollout_order not in ROLLOUT_ORDERS:
            raise ValueError(
                f"rollout_order must be one of {ROLLOUT_ORDERS}, got "
                f"{self.rollout_order!r}"
            )
        self.rollout_order = RolloutOrder(self.rollout_order)
        if self.rollout_order is RolloutOrder.FAIR:
            self.rollout_share = RolloutShare()
        if self.trainers < 1:
            raise ValueError(f"trainers must be >= 1, got {self.trainers}")
        if self.max_rolling is not None and self.max_rolling < 1:
            raise ValueError(f"max_rolling must be >= 1, got {self.max_rolling}")
        if self.concurrency not in CONCURRENCIES:
            raise ValueError(
                f"concurrency must be one of {CONCURRENCIES}, got {self.concurrency!r}"
            )
        self.concurrency = Concurrency(self.concurrency)
        if self.concurrency is Concurrency.ADAPTIVE:
            if self.mode is not Mode.ASYNC:
                raise ValueError(
                    f"concurrency=adaptive needs mode async, got {self.mode.value}"
                )
            self.loop = LoopLoad(self.trainers, self.target_load)

    # -- queries ----------------------------------------------------------------
    def finished(self) -> bool:
        return bool(self.tasks) and not self.table.live

    def rolling(self) -> list[str]:
        """Tasks rolling out now, in submission order."""
        return sorted(self.table.rolling, key=lambda n: self.tasks[n].order)

    def waiting_for_load(self) -> list[str]:
        """Tasks held ``load`` (concurrency=adaptive), in the order they enter."""
        keys = self.table.waiting_held.get(HoldReason.LOAD, [])
        return [self.table.task(k).name for k in keys]

    def kv_in_use(self) -> int:
        """Estimated KV of the batches rolling out and the evals running now."""
        return self.table.rolling_kv + self.eval_kv

    def kv_used(self) -> int:
        """What admission counts as used: the estimate or the server's report."""
        return max(self.kv_in_use(), self.live_kv)

    # -- transitions ------------------------------------------------------------
    def handle(self, event: Event) -> list[Action]:
        actions = self._handle(event)
        share, loop = self.rollout_share, self.loop
        left = False
        if share is not None or loop is not None:  # every end and pause passes
            for a in actions:
                if isinstance(a, FinishTask | TaskPaused):
                    if share is not None:
                        share.leave(self.tasks[a.task])
                    if loop is not None and loop.inside(a.task):
                        loop.leave(a.task)
                        left = True
        if left:  # its room in the loop goes to the next waiting task
            actions += self._admit()
        return actions

    def _handle(self, event: Event) -> list[Action]:
        if isinstance(event, Submitted):
            return self._submitted(event)
        if isinstance(event, KVUsage):
            self.live_kv = max(0, int(event.used_bytes))
            return self._admit()
        task = self.tasks.get(event.task)
        if task is None:
            raise ProtocolError(f"event for unknown task: {event}")
        if isinstance(event, EvalDone):
            return self._eval_done(task, event.version)
        if not task.active:
            return []  # late news about a task that already ended
        if isinstance(event, Cancel | Pause | Resume):
            return self._control(task, event)
        if isinstance(event, Reweight):
            if not event.weight > 0:
                raise ProtocolError(f"{event}: weight must be > 0")
            task.weight = event.weight  # the fair queue reads it at each pick
            return []
        if isinstance(event, TaskFailed):
            return self._fail(task, event.reason)
        if isinstance(event, TaskError):
            if task.stop is Stop.CANCEL:
                return self._cancel(task)
            return self._error(task, event.reason)
        if isinstance(event, RolloutDone):
            self._expect(task, Phase.ROLLOUT, event.version)
            if self.rollout_share is not None:
                self.rollout_share.end(task, event.tokens)
            if self.loop is not None:
                self.loop.rolled_out(task.name, event.rollout_s)
            if task.stop is Stop.CANCEL:
                return self._cancel(task)
            self.table.move(task, Phase.QUEUED)  # its KV is free again
            self.train_queue.add(task)
            return [*self._next_train(), *self._admit()]
        if isinstance(event, TrainDone):
            if task.name not in self.training or event.version != task.version + 1:
                raise ProtocolError(f"{event} while training {sorted(self.training)}")
            del self.training[task.name]
            self.train_queue.finished(task, event.train_s)
            if self.loop is not None:
                self.loop.trained(task.name, event.train_s)
            task.steps_done += 1
            task.errors = 0
            if task.stop is Stop.CANCEL:  # committed, but never served again
                self.table.move(task, version=event.version)
                return [*self._cancel(task), *self._next_train()]
            self.table.move(task, Phase.PUBLISH, event.version)
            return [StartPublish(task.name, task.version), *self._next_train()]
        if isinstance(event, PublishDone):
            self._expect(task, Phase.PUBLISH, event.version)
            if self.loop is not None:
                self.loop.published(task.name, event.publish_s)
            if task.eval_due(event.version):
                task.evals += 1
                self.eval_queue.append((task.name, event.version))
            return self._after_publish(task)
        raise ProtocolError(f"unknown event {event!r}")

    def _submitted(self, event: Submitted) -> list[Action]:
        if event.task in self.tasks:
            raise ProtocolError(f"task {event.task!r} submitted twice")
        if not event.weight > 0:
            raise ProtocolError(f"task {event.task!r}: weight {event.weight} <= 0")
        if event.trainer is not None and not 0 <= event.trainer < self.trainers:
            raise ProtocolError(
                f"task {event.task!r} placed on trainer {event.trainer}, but there "
                f"are {self.trainers}"
            )
        if self.kv_budget is not None and event.kv_bytes > self.kv_budget:
            raise AdmissionError(
                f"task {event.task!r}: one rollout batch needs "
                f"{event.kv_bytes / 2**20:.1f} MiB of KV cache but the budget is "
                f"{self.kv_budget / 2**20:.1f} MiB; it could never be admitted "
                "(lower batch_size, n_samples or max_new_tokens, or raise the budget)"
            )
        task = TaskState(
            event.task,
            event.total_steps,
            version=event.version,
            start_version=event.version,
            kv_bytes=event.kv_bytes,
            priority=event.priority,
            order=len(self.tasks),
            trainer=event.trainer,
            eval_every=event.eval_every,
            eval_kv_bytes=event.eval_kv_bytes,
            tenant=event.tenant,
            weight=event.weight,
            rollout=event.rollout,
        )
        if self.kv_budget is not None and event.eval_kv_bytes > self.kv_budget:
            raise AdmissionError(
                f"task {event.task!r}: one eval needs "
                f"{event.eval_kv_bytes / 2**20:.1f} MiB of KV cache but the budget "
                f"is {self.kv_budget / 2**20:.1f} MiB (lower eval_samples)"
            )
        task.steps_done = event.version  # one committed version per step
        self.tasks[event.task] = task
        self.table.add(task)
        if self.rollout_share is not None:
            self.rollout_share.join(task)
        return self._after_publish(task)

    def _after_publish(self, task: TaskState) -> list[Action]:
        actions: list[Action] = []
        if task.steps_done >= task.total_steps and task.evals:
            # Done training; it finishes when its last eval returns.
            self.table.move(task, Phase.EVAL)
            if self.loop is not None:
                self.loop.leave(task.name)  # no more load on the trainers
            actions += self._next_train()
        elif task.steps_done >= task.total_steps:
            self.table.move(task, Phase.DONE)
            actions.append(FinishTask(task.name))
            # A finished task can release a sync barrier or a single-task turn.
            actions += self._next_train()
        elif task.stop is Stop.CANCEL:
            return self._cancel(task)
        elif task.stop is Stop.PAUSE:
            return self._pause_now(task)
        else:
            return [*actions, *self._ready(task)]
        return [*actions, *self._admit()]

    def _ready(self, task: TaskState) -> list[Action]:
        """``task`` may take its next step: it waits to roll out, or, when it
        needs no rollout, its batch joins the training queue at once."""
        if task.rollout:
            self.table.move(task, Phase.PENDING, held=None)
            return self._admit()
        self.table.move(task, Phase.QUEUED, held=None)
        self.train_queue.add(task)
        return [*self._next_train(), *self._admit()]

    # -- control (pause, resume, cancel) ----------------------------------------
    def _control(self, task: TaskState, event: Cancel | Pause | Resume) -> list[Action]:
        idle = task.phase in (Phase.PENDING, Phase.PAUSED, Phase.QUEUED)
        if isinstance(event, Cancel):
            task.reason = event.reason
            if idle:
                return self._cancel(task)
            task.stop = Stop.CANCEL
            return []
        if isinstance(event, Pause):
            if task.phase is Phase.PENDING:
                return self._pause_now(task)
            if task.phase is Phase.QUEUED and not task.rollout:
                self.train_queue.discard(task.name)  # nothing generated to lose
                return self._pause_now(task)
            if task.phase is not Phase.PAUSED and task.stop is not Stop.CANCEL:
                task.stop = Stop.PAUSE
            return []
        # Resume
        if task.stop is Stop.PAUSE:
            task.stop = Stop.NONE
        if task.phase is Phase.PAUSED:
            if self.rollout_share is not None:
                self.rollout_share.join(task)
            return self._ready(task)
        return []

    def _pause_now(self, task: TaskState) -> list[Action]:
        task.stop = Stop.NONE
        self.table.move(task, Phase.PAUSED)
        # A paused task can release a sync barrier or a single-task turn.
        return [
            TaskPaused(task.name, task.version),
            *self._next_train(),
            *self._admit(),
        ]

    def _cancel(self, task: TaskState) -> list[Action]:
        self._drop_batch(task)
        self._drop_evals(task)
        self.table.move(task, Phase.CANCELLED)  # frees its KV and train slot
        task.stop = Stop.NONE
        return [
            FinishTask(task.name, reason=task.reason or "cancelled", cancelled=True),
            *self._next_train(),
            *self._admit(),
        ]

    # -- evals ------------------------------------------------------------------
    def _eval_done(self, task: TaskState, version: int) -> list[Action]:
        kv = self.evals_running.pop((task.name, version), None)
        if kv is None:
            raise ProtocolError(f"task {task.name!r}: no eval of v{version} running")
        self.eval_kv -= kv
        actions: list[Action] = []
        if task.active:
            task.evals -= 1
            if task.phase is Phase.EVAL and not task.evals:
                self.table.move(task, Phase.DONE)
                actions.append(FinishTask(task.name))
        return [*actions, *self._admit()]

    def _drop_evals(self, task: TaskState) -> None:
        """An ended task's queued evals go; running ones return on their own."""
        if task.evals:
            self.eval_queue = deque(e for e in self.eval_queue if e[0] != task.name)
            task.evals = 0

    def _start_evals(self, used: int) -> tuple[list[Action], int, bool]:
        """Start queued evals while they fit the KV budget, oldest first; the
        rollouts wait behind one that does not (no overtaking)."""
        starts: list[Action] = []
        while self.eval_queue:
            name, version = self.eval_queue[0]
            kv = self.tasks[name].eval_kv_bytes
            if self.kv_budget is not None and used + kv > self.kv_budget:
                return starts, used, True
            self.eval_queue.popleft()
            self.evals_running[(name, version)] = kv
            self.eval_kv += kv
            used += kv
            starts.append(StartEval(name, version))
        return starts, used, False

    # -- admission --------------------------------------------------------------
    def _turn(self) -> list[Key]:
        """The waiting tasks the mode lets roll out now (resources aside), in
        admission order."""
        table = self.table
        if self.mode is Mode.ASYNC:
            return table.waiting
        if self.mode is Mode.SYNC:
            # Round v starts when every task has committed and published v: v is
            # the lowest version of all, and no task at v is publishing.
            v = min(table.versions)
            return [] if table.publishing[v] else table.waiting_at.get(v, [])
        first = table.running[0]  # one task at a time, by priority and arrival
        return [first] if table.task(first).phase is Phase.PENDING else []

    def _admit(self) -> list[Action]:
        """Start what may roll out; hold the rest, emitting a hold only when a
        task's reason changes. The pass visits the tasks it starts and the ones
        whose reason changes, not every waiting task (the sorted keys of the
        table locate them)."""
        table = self.table
        evals, used, eval_blocked = self._start_evals(self.kv_used())
        if not table.waiting:
            return evals
        rolling = len(table.rolling)
        starts: list[Key] = []
        blocked: HoldReason | None = None  # a resource hold: nobody behind overtakes
        block_at: Key | None = None
        turn = self._turn()
        if eval_blocked and turn:
            blocked, block_at = HoldReason.KV, turn[0]
        loop, outside = self.loop, []  # new tasks the loop has no room for
        for key in [] if eval_blocked else turn:
            task = table.task(key)
            kv_bytes = task.kv_bytes
            new = loop is not None and not loop.inside(task.name)
            if new and loop is not None and not loop.may_enter(task.trainer):
                outside.append(key)
                continue
            if self.max_rolling is not None and rolling >= self.max_rolling:
                blocked = HoldReason.CAP
            elif self.kv_budget is not None and used + kv_bytes > self.kv_budget:
                blocked = HoldReason.KV
            if blocked is not None:
                block_at = key
                break
            used += kv_bytes
            rolling += 1
            starts.append(key)
            if new and loop is not None:
                loop.enter(task.name, task.tenant, task.trainer)
        holds: list[tuple[Key, HoldReason]] = []
        holds += [  # the ones behind a resource hold get its reason below
            (k, HoldReason.LOAD)
            for k in outside
            if table.task(k).held is not HoldReason.LOAD
            and (block_at is None or k < block_at)
        ]
        turn_hold = _TURN_HOLD.get(self.mode)
        if turn_hold is not None:  # ahead of a resource hold: waits for its turn
            started = set(starts)
            for held, keys in table.waiting_held.items():
                if held is not turn_hold:
                    end = len(keys) if block_at is None else bisect_left(keys, block_at)
                    holds += [(k, turn_hold) for k in keys[:end] if k not in started]
        if blocked is not None:  # from the resource hold on: everyone waits
            assert block_at is not None  # set with blocked
            for held, keys in table.waiting_held.items():
                if held is not blocked:
                    holds += [(k, blocked) for k in keys[bisect_left(keys, block_at) :]]
        actions: list[tuple[Key, Action]] = []
        share = self.rollout_share
        for key in starts:
            task = table.task(key)
            table.move(task, Phase.ROLLOUT, held=None)
            priority = 0 if share is None else share.start(task)
            actions.append((key, StartRollout(task.name, task.version, priority)))
        for key, reason in holds:
            task = table.task(key)
            table.move(task, held=reason)
            actions.append((key, HoldRollout(task.name, task.version, reason)))
        actions.sort(key=lambda ka: ka[0])  # admission order, as one pass decides
        return [*evals, *(a for _, a in actions)]

    # -- training ---------------------------------------------------------------
    def _may_train(self, task: TaskState) -> bool:
        if self.mode in (Mode.SEQUENTIAL, Mode.COLLOCATED):
            # One task at a time: a task that needs no rollout is queued
            # before its turn comes.
            return self.table.running[0] == task.key
        # Sync: training of round v waits for every rollout of round v.
        return self.mode is not Mode.SYNC or not self.table.unrolled[task.version]

    def _next_train(self) -> list[Action]:
        if not self.train_queue:
            return []
        if self.mode is Mode.SYNC and all(
            self.table.unrolled[v] for v in self.table.queued
        ):
            return []  # every queued batch's round is still rolling out
        busy = set(self.training.values())
        free = [i for i in range(self.trainers) if i not in busy]
        picked: list[tuple[TaskState, int]] = []
        for name in self.train_queue:
            if not free:
                break
            task = self.tasks[name]
            if not self._may_train(task):
                # Its round is still rolling out. A batch of an earlier round (a
                # task that arrived or resumed late) may go: the round's barrier
                # waits for that task, so holding it would deadlock.
                continue
            slot = free[0] if task.trainer is None else task.trainer
            if slot not in free:
                continue  # its trainer is busy; a batch for a free one may go
            free.remove(slot)
            picked.append((task, slot))
        actions: list[Action] = []
        for task, slot in picked:
            self.train_queue.remove(task.name)
            self.train_queue.started(task)
            self.table.move(task, Phase.TRAIN)
            self.training[task.name] = slot
            actions.append(StartTrain(task.name, task.version, slot))
        return actions

    # -- failures ---------------------------------------------------------------
    def _error(self, task: TaskState, reason: str) -> list[Action]:
        task.errors += 1
        task.reason = reason
        if task.stop is Stop.PAUSE and task.phase is not Phase.PENDING:
            # Pausing (a job's pause, a drain at shutdown): the failed work is
            # dropped and the task stops at its last committed version, which
            # a resume continues from; a stop never fails a task.
            self._drop_batch(task)
            return self._pause_now(task)
        if task.errors > self.task_retries:
            return self._fail(
                task, f"{reason} (failed {task.errors}x at v{task.version})"
            )
        if task.phase is Phase.PUBLISH:
            return [StartPublish(task.name, task.version)]
        if task.phase is Phase.PENDING:
            raise ProtocolError(f"task {task.name!r}: error while nothing in flight")
        # A failed rollout or training step: generate a fresh batch at the same
        # version (the failed batch is dropped, so the task stays on-policy).
        self._drop_batch(task)
        if task.stop is Stop.PAUSE:
            return self._pause_now(task)
        if not task.rollout:
            return self._ready(task)
        self.table.move(task, Phase.PENDING)
        return [*self._next_train(), *self._admit()]

    def _drop_batch(self, task: TaskState) -> None:
        if self.rollout_share is not None:
            self.rollout_share.end(task)  # a rollout that failed or was dropped
        self.train_queue.discard(task.name)
        if self.training.pop(task.name, None) is not None:
            self.train_queue.aborted(task)

    def _fail(self, task: TaskState, reason: str) -> list[Action]:
        self._drop_batch(task)
        self._drop_evals(task)
        self.table.move(task, Phase.FAILED)  # frees its KV and train slot
        task.reason = reason
        return [
            FinishTask(task.name, failed=True, reason=reason),
            *self._next_train(),
            *self._admit(),
        ]

    @staticmethod
    def _expect(task: TaskState, phase: Phase, version: int) -> None:
        if task.phase is not phase or version != task.version:
            raise ProtocolError(
                f"task {task.name!r}: got {phase.value} v{version} while in "
                f"{task.phase.value} at v{task.version}"
            )
