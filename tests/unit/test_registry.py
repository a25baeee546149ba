"""The per-task adapter registry: pinning, draining, retiring."""

from __future__ import annotations

import threading

import pytest

from areal_marlaas.rollout.registry import AdapterRegistry
from tests.support.leases import LeaseLog


def test_lease_pins_version_across_a_publish():
    reg = AdapterRegistry(listener=(log := LeaseLog()))
    reg.set_current("a", 0, "/a/v0")

    with reg.lease("a") as v:
        old = reg.set_current("a", 1, "/a/v1")
        assert v == 0 and old == "a-v0"
        assert log.inflight("a-v0") == 1
        with reg.lease("a") as v_new:
            assert v_new == 1

    assert log.inflight("a-v0") == 0
    assert [r[0] for r in log.leases] == ["a-v0", "a-v1"]
    assert reg.served() == {"a": (1, "/a/v1")}


def test_wait_drained_blocks_until_last_lease_ends():
    reg = AdapterRegistry()
    reg.set_current("a", 0)
    entered, release = threading.Event(), threading.Event()

    def hold():
        with reg.lease("a"):
            entered.set()
            release.wait(5)

    t = threading.Thread(target=hold)
    t.start()
    entered.wait(5)
    reg.set_current("a", 1)

    assert reg.wait_drained("a-v0", timeout=0.05) is False
    release.set()
    assert reg.wait_drained("a-v0", timeout=5) is True
    t.join()


def test_lease_of_unknown_task_names_the_fix():
    with pytest.raises(KeyError, match="load_adapter"), AdapterRegistry().lease("nope"):
        pass


def test_retire_bookkeeping():
    reg = AdapterRegistry(listener=(log := LeaseLog()))
    reg.set_current("a", 0)
    reg.set_current("a", 1)
    assert reg.retiring() == {"a-v0"}

    reg.mark_retired("a-v0")

    assert reg.retiring() == set() and "a-v0" in log.retired_at
    assert reg.version("a") == 1


def test_a_task_that_leaves_retires_its_adapter():
    reg = AdapterRegistry()
    reg.set_current("a", 3, "/a/v3")

    assert reg.forget("a") == "a-v3"
    assert reg.retiring() == {"a-v3"} and not reg.has("a") and reg.served() == {}
