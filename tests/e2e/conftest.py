"""Fixtures of the tests against the real server and trainer: a multi-LoRA
engine on the session's server, the deterministic reference run, and two hosts
in network namespaces."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.rollouts import rollout_engine
from tests.support.runs import DETERMINISTIC, marlaas_train, one_thread_env, small_run
from tests.support.two_hosts import two_hosts_up


@pytest.fixture
def engine(vllm_server):
    """A multi-LoRA rollout engine connected to the session's server."""
    eng = rollout_engine(vllm_server.address, "rollout", 256)
    yield eng
    eng.destroy()


@pytest.fixture(scope="module")
def two_hosts():
    """Host 1 and host 2 (tests/support/two_hosts.py) with a Ray head on host 1
    (1 CPU, 6 GiB: the trainer fits only there) and a node on host 2 (2 CPUs,
    3 GiB: the rollout worker fits only there), for a module's tests; torn down
    after them."""
    with two_hosts_up() as hosts:
        hosts.start_ray(
            head={"cpus": 1, "memory_gib": 6}, worker={"cpus": 2, "memory_gib": 3}
        )
        yield hosts


@pytest.fixture(scope="session")
def reference_run(tmp_path_factory, vllm_server) -> Path:
    """The quickstart's 3 tasks x 2 steps (``small_run``), run deterministically
    and uninterrupted on the session's server: what a resumed run, the same run
    under Ray and a task trained alone must commit byte for byte."""
    tmp = tmp_path_factory.mktemp("reference")
    argv = [*small_run(tmp, vllm_server.address, "ref"), *DETERMINISTIC]
    proc, _ = marlaas_train(argv, one_thread_env())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return tmp / "marlaas-quickstart" / "ref"
