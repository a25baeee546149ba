"""The fair train order of the pure core (``train_order=fair``), driven in
simulated time: weighted trainer time between backlogged tenants, a bound on
how long a tenant's batch waits, and the core's invariants under arrivals,
pauses and cancels."""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from areal_marlaas.scheduler.core import (
    Cancel,
    FinishTask,
    HoldRollout,
    Pause,
    PublishDone,
    Resume,
    Reweight,
    RolloutDone,
    SchedulerCore,
    StartPublish,
    StartRollout,
    StartTrain,
    Submitted,
    TrainDone,
)
from areal_marlaas.scheduler.tasks import Phase

# tenant -> (weight, step cost in trainer-seconds, tasks)
TENANTS = st.dictionaries(
    st.sampled_from(["heavy", "a", "b", "c"]),
    st.tuples(st.sampled_from([1.0, 2.0, 3.0]), st.integers(1, 8), st.integers(1, 3)),
    min_size=2,
)


@dataclass
class Run:
    """A simulated run: what every tenant got and when it was backlogged."""

    core: SchedulerCore
    costs: dict[str, float]  # tenant -> seconds per step
    weights: dict[str, float]
    samples: list[tuple[float, frozenset[str], dict[str, float]]] = field(
        default_factory=list
    )  # (time, backlogged tenants, weighted service dispatched so far)
    starts: list[tuple[float, str, str]] = field(
        default_factory=list
    )  # t, tenant, task
    queued: dict[str, list[float]] = field(default_factory=dict)  # task -> times
    log: list = field(default_factory=list)

    def tenant(self, task: str) -> str:
        return self.core.tasks[task].tenant

    def backlogged(self) -> frozenset[str]:
        """Tenants with a batch waiting for a trainer."""
        return frozenset(
            t.tenant for t in self.core.tasks.values() if t.phase is Phase.QUEUED
        )


def simulate(
    tenants: dict[str, tuple[float, int, int]],
    steps: int,
    trainers: int,
    seed: int,
    rollout_s: float = 0.0,
    arrivals: bool = False,
    control: bool = False,
    reweight: tuple[float, str, float] | None = None,
) -> Run:
    """Each tenant's tasks on the fair core in simulated time: rollouts take
    ``rollout_s`` (x a random factor when ``arrivals``), steps their tenant's
    cost, publishes nothing; ``arrivals``: tasks arrive at random times;
    ``control``: random pauses, resumes and cancels; ``reweight`` = (time,
    tenant, weight): the tenant's new weight from then on."""
    rng = random.Random(seed)
    core = SchedulerCore(train_order="fair", trainers=trainers)
    run = Run(core, {t: c for t, (_, c, _) in tenants.items()}, {})
    run.weights = {t: w for t, (w, _, _) in tenants.items()}
    served = dict.fromkeys(tenants, 0.0)
    clock: list[tuple[float, int, object]] = []
    n = 0

    def at(t: float, event: object) -> None:
        nonlocal n
        heapq.heappush(clock, (t, n, event))
        n += 1

    for tenant, (weight, _, k) in tenants.items():
        for i in range(k):
            t0 = rng.uniform(0, 20) if arrivals else 0.0
            at(t0, Submitted(f"{tenant}{i}", steps, tenant=tenant, weight=weight))
    if control:
        names = [f"{t}{i}" for t, (_, _, k) in tenants.items() for i in range(k)]
        for _ in range(3):
            task = rng.choice(names)
            t = rng.uniform(0, 60)
            kind = rng.choice([Pause, Cancel])
            at(t, kind(task) if kind is Pause else Cancel(task, "test"))
            if kind is Pause:
                at(t + rng.uniform(1, 30), Resume(task))
    if reweight is not None:
        t, tenant, weight = reweight
        for i in range(tenants[tenant][2]):
            at(t, Reweight(f"{tenant}{i}", weight))
    while clock:
        now, _, event = heapq.heappop(clock)
        task = getattr(event, "task", None)
        if isinstance(event, Reweight):
            run.weights[core.tasks[event.task].tenant] = event.weight
        if isinstance(event, Pause | Resume | Cancel) and task not in core.tasks:
            continue
        actions = core.handle(event)  # type: ignore[arg-type]
        if isinstance(event, RolloutDone):  # its batch joined the training queue
            run.queued.setdefault(event.task, []).append(now)
        for a in actions:
            run.log.append(a)
            if isinstance(a, FinishTask | HoldRollout):
                continue
            tenant = run.tenant(a.task)
            if isinstance(a, StartRollout):
                r = rollout_s * (rng.uniform(0.5, 1.5) if arrivals else 1.0)
                at(now + r, RolloutDone(a.task, a.version))
            elif isinstance(a, StartTrain):
                cost = run.costs[tenant]
                served[tenant] += cost / run.weights[tenant]
                run.starts.append((now, tenant, a.task))
                at(now + cost, TrainDone(a.task, a.version + 1, train_s=cost))
            elif isinstance(a, StartPublish):
                at(now, PublishDone(a.task, a.version))
        run.samples.append((now, run.backlogged(), dict(served)))
    assert core.finished()
    return run


def cmax(run: Run) -> float:
    """The largest weighted cost of one step."""
    return max(run.costs[t] / run.weights[t] for t in run.costs)


def worst_gap(run: Run) -> float:
    """Over every interval in which two tenants were both backlogged, the
    largest change of the difference of their weighted service."""
    worst = 0.0
    names = sorted(run.costs)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            lo = hi = None
            for _, backlogged, served in run.samples:
                if a in backlogged and b in backlogged:
                    gap = served[a] - served[b]
                    lo = gap if lo is None else min(lo, gap)
                    hi = gap if hi is None else max(hi, gap)
                    worst = max(worst, hi - lo)
                else:
                    lo = hi = None
    return worst


@settings(max_examples=150, deadline=None)
@given(tenants=TENANTS, trainers=st.sampled_from([1, 2]), seed=st.integers(0, 10**6))
def test_backlogged_tenants_weighted_service_stays_within_twice_the_largest_step(
    tenants, trainers, seed
):
    """Between two backlogged tenants, the difference of weighted service
    (trainer-seconds / weight, dispatched) moves by at most (trainers + 1) x the
    largest weighted step: 2x with one trainer; each further trainer may hold
    one more step that started before the other tenant was backlogged."""
    # Rollouts take no time and every tenant has trainers + 2 tasks: each keeps a
    # batch queued while its others train or publish.
    tenants = {t: (w, c, trainers + 2) for t, (w, c, _) in tenants.items()}
    run = simulate(tenants, steps=6, trainers=trainers, seed=seed)
    assert worst_gap(run) <= (trainers + 1) * cmax(run) + 1e-9


@settings(max_examples=150, deadline=None)
@given(tenants=TENANTS, trainers=st.sampled_from([1, 2]), seed=st.integers(0, 10**6))
def test_no_tenant_waits_forever(tenants, trainers, seed):
    """While tenant j's oldest queued batch waits, any other tenant i starts at
    most ceil(3 cmax / (c_i / w_i)) + trainers steps (cmax: the largest c / w):
    a finite bound, whatever the arrivals and rollout times."""
    run = simulate(tenants, 6, trainers, seed, rollout_s=3.0, arrivals=True)
    bound = {
        i: math.ceil(3 * cmax(run) / (run.costs[i] / run.weights[i])) + trainers
        for i in run.costs
    }
    last_start: dict[str, float] = {}
    for start, tenant, task in run.starts:
        queued = max(t for t in run.queued[task] if t <= start)
        # Its tenant's oldest batch since it was queued or its tenant's
        # previous batch started (FIFO within a tenant).
        head = max(queued, last_start.get(tenant, queued))
        last_start[tenant] = start
        others: dict[str, int] = {}
        for t, other, _ in run.starts:
            if head <= t < start and other != tenant:
                others[other] = others.get(other, 0) + 1
        for other, count in others.items():
            assert count <= bound[other], (tenant, other, count, bound)


@settings(max_examples=100, deadline=None)
@given(tenants=TENANTS, trainers=st.sampled_from([1, 2]), seed=st.integers(0, 10**6))
def test_arrivals_pauses_and_cancels_keep_the_invariants(tenants, trainers, seed):
    run = simulate(
        tenants, 4, trainers, seed, rollout_s=2.0, arrivals=True, control=True
    )
    for name, task in run.core.tasks.items():
        trained = [
            a.version for a in run.log if isinstance(a, StartTrain) and a.task == name
        ]
        # Version order, each version once, from its own published version.
        assert trained == list(range(len(trained)))
        if task.phase is Phase.DONE:
            assert task.version == 4


def test_a_reweighted_tenant_gets_its_new_share_from_then_on():
    """a and b alike (weight 1, step 1 s, 3 tasks each); at t=20 a's weight goes
    to 3: from then on, while both are backlogged, a starts 3x b's steps."""
    tenants = {"a": (1.0, 1, 3), "b": (1.0, 1, 3)}
    run = simulate(tenants, steps=40, trainers=1, seed=0, reweight=(20.0, "a", 3.0))
    before = [x for t, x, _ in run.starts if t < 20]
    assert abs(before.count("a") - before.count("b")) <= 1
    end = min(t for t, b, _ in run.samples if t > 20 and len(b) < 2)
    after = [x for t, x, _ in run.starts if 20 <= t < end]
    assert after.count("a") == pytest.approx(3 * after.count("b"), rel=0.1)
