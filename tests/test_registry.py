"""The per-task adapter registry: pinning, draining, retiring."""

from __future__ import annotations

import threading

import pytest

from areal_marlaas.rollout.registry import AdapterRegistry


def test_lease_pins_version_across_a_publish():
    reg = AdapterRegistry()
    reg.set_current("a", 0)

    with reg.lease("a") as v:
        old = reg.set_current("a", 1)
        assert v == 0 and old == "a-v0"
        assert reg.inflight("a-v0") == 1
        with reg.lease("a") as v_new:
            assert v_new == 1

    assert reg.inflight("a-v0") == 0
    assert [r.name for r in reg.records] == ["a-v0", "a-v1"]


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
    with pytest.raises(KeyError, match="load_adapter"):
        with AdapterRegistry().lease("nope"):
            pass


def test_retire_bookkeeping():
    reg = AdapterRegistry()
    reg.set_current("a", 0)
    reg.set_current("a", 1)
    assert reg.retiring() == {"a-v0"}

    reg.mark_retired("a-v0")

    assert reg.retiring() == set() and reg.retired_at("a-v0") is not None
    assert reg.tasks() == {"a": 1}
