"""The trainer pool's placement: a pure policy over its workers (recorders stand
in for the FSDP engines here; tests/e2e/test_train_e2e.py runs real ones)."""

from __future__ import annotations

import pytest

from areal_marlaas.scheduler.backends import TrainBackend
from areal_marlaas.train.pool import TrainerPool, trainer_role


class Worker:
    def __init__(self, fail_add: bool = False):
        self.tasks: set[str] = set()
        self.fail_add = fail_add

    def add_task(self, name, **kwargs):
        if self.fail_add:
            raise RuntimeError("bad adapter")
        self.tasks.add(name)

    def remove_task(self, name):
        self.tasks.discard(name)


def test_tasks_go_to_the_worker_holding_the_fewest_and_stay_there():
    w = [Worker(), Worker()]
    pool = TrainerPool(w)
    for name in "abc":
        pool.add_task(name)
    assert (w[0].tasks, w[1].tasks) == ({"a", "c"}, {"b"})
    assert [pool.place(n) for n in "abc"] == [0, 1, 0]  # placed once
    pool.remove_task("a")
    assert pool.trainer_of("a") is None and w[0].tasks == {"c"}
    pool.add_task("d")  # 1 task each now: the lowest index
    assert pool.trainer_of("d") == 0
    with pytest.raises(KeyError, match="'zz' is on no trainer worker"):
        pool.train_task("zz", [])
    assert [trainer_role(i) for i in range(3)] == ["actor", "actor1", "actor2"]


def test_a_failed_add_leaves_no_placement_behind():
    w = [Worker(fail_add=True), Worker()]
    pool = TrainerPool(w)
    with pytest.raises(RuntimeError, match="bad adapter"):
        pool.add_task("a")
    assert pool.trainer_of("a") is None
    w[0].fail_add = False
    pool.add_task("b")  # worker 0 still counts as empty
    assert pool.trainer_of("b") == 0


def test_a_pool_is_what_the_runtime_trains_through():
    assert isinstance(TrainerPool([Worker()]), TrainBackend)
    assert not isinstance(Worker(), TrainBackend)  # an engine alone is not
