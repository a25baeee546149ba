"""What the runtime tells the scheduling core (events) and what the core asks of
it in return (actions): plain frozen records, compared by value in the tests."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class HoldReason(StrEnum):
    """Why a task ready to roll out waits (``HoldRollout.reason``; the runtime's
    ``held`` status and admission records carry the value)."""

    KV = "kv"  # its batch does not fit the KV budget now
    CAP = "cap"  # max_rolling tasks roll out already
    BARRIER = "barrier"  # sync: its round has not started
    TURN = "turn"  # sequential / collocated: another task's turn
    # concurrency=adaptive: the tasks in the loop already saturate the trainers
    LOAD = "load"


# -- events (runtime -> core) ---------------------------------------------------
@dataclass(frozen=True)
class Submitted:
    task: str
    total_steps: int
    version: int = 0  # resume starts from the committed version
    kv_bytes: int = 0  # KV footprint of one rollout batch (admission)
    priority: int = 0  # higher is admitted first
    # The trainer holding the task's weights and optimizer state: its steps run
    # there only. None: any free trainer (state that moves with the batch).
    trainer: int | None = None
    # Evaluate every eval_every-th committed version and the last (0: never);
    # an eval's KV footprint counts against the budget like a rollout's.
    eval_every: int = 0
    eval_kv_bytes: int = 0
    # Fair share (train_order=fair): the tenant whose share the task's steps
    # count toward ("": the task is its own tenant) and the tenant's weight.
    tenant: str = ""
    weight: float = 1.0
    # False: a task whose batches need no rollout (supervised): ready, it goes
    # straight to the training queue, past admission.
    rollout: bool = True


@dataclass(frozen=True)
class RolloutDone:
    task: str
    version: int
    # Tokens its batch generated, charged to its tenant's share of the server
    # (rollout_order=fair; None: the share's estimate is charged).
    tokens: int | None = None
    # Seconds the rollout took (concurrency=adaptive measures the loop with it).
    rollout_s: float | None = None


@dataclass(frozen=True)
class TrainDone:
    task: str
    version: int  # the new, committed version
    # The step's trainer-seconds, charged to its tenant's fair share (None: the
    # queue's estimate is charged).
    train_s: float | None = None


@dataclass(frozen=True)
class PublishDone:
    task: str
    version: int
    publish_s: float | None = None  # seconds it took (concurrency=adaptive)


@dataclass(frozen=True)
class EvalDone:
    """An eval of ``version`` returned (done or failed: it never fails the task)."""

    task: str
    version: int


@dataclass(frozen=True)
class TaskError:
    """The task's phase in flight failed; the core retries it or fails the task."""

    task: str
    reason: str


@dataclass(frozen=True)
class TaskFailed:
    """Fail the task now, without retry."""

    task: str
    reason: str


@dataclass(frozen=True)
class KVUsage:
    """KV bytes the server reports in use (``vllm:kv_cache_usage_perc``)."""

    used_bytes: int


@dataclass(frozen=True)
class Cancel:
    """End the task: now if nothing of it is in flight, else when it returns."""

    task: str
    reason: str = "cancelled"


@dataclass(frozen=True)
class Pause:
    """Stop the task after its current step is committed and published."""

    task: str


@dataclass(frozen=True)
class Resume:
    """Let a paused task roll out again (or withdraw a pause not yet reached)."""

    task: str


@dataclass(frozen=True)
class Reweight:
    """The task's tenant has a new weight (train_order=fair): what it is charged
    from now on; service already charged stays."""

    task: str
    weight: float


Event = (
    Submitted
    | RolloutDone
    | TrainDone
    | PublishDone
    | EvalDone
    | TaskError
    | TaskFailed
    | KVUsage
    | Cancel
    | Pause
    | Resume
    | Reweight
)


# -- actions (core -> runtime) --------------------------------------------------
@dataclass(frozen=True)
class StartRollout:
    task: str
    version: int
    # The server's priority for its requests (lower is served first; 0 unless
    # rollout_order=fair).
    priority: int = 0


@dataclass(frozen=True)
class StartTrain:
    task: str
    version: int  # the version the batch was generated with
    trainer: int = 0  # which trainer runs the step


@dataclass(frozen=True)
class StartPublish:
    task: str
    version: int


@dataclass(frozen=True)
class StartEval:
    """Evaluate the task's committed, published ``version`` on its held-out rows:
    rollout-side work beside the task's next rollout (same adapter version), never
    in a train step's way."""

    task: str
    version: int


@dataclass(frozen=True)
class FinishTask:
    task: str
    failed: bool = False
    reason: str = ""
    cancelled: bool = False


@dataclass(frozen=True)
class TaskPaused:
    """The task stopped at ``version`` (committed and published) until resumed."""

    task: str
    version: int


@dataclass(frozen=True)
class HoldRollout:
    """A task ready to roll out must wait; emitted once per wait. ``reason``:
    ``kv`` (budget), ``cap`` (max_rolling), ``barrier`` (sync round), ``turn``
    (single-task modes) or ``load`` (a new task while the loop saturates the
    trainers, concurrency=adaptive)."""

    task: str
    version: int
    reason: HoldReason


Action = (
    StartRollout
    | StartTrain
    | StartPublish
    | StartEval
    | FinishTask
    | HoldRollout
    | TaskPaused
)
