"""A background thread that samples device utilization while a bench run goes:
CPU time and memory of the server's and the trainer's process trees, the
machine's used memory, and the server's ``vllm:num_requests_running`` gauge."""

from __future__ import annotations

import threading
import time
from typing import Any

import psutil
from areal.utils import logging

from areal_marlaas.rollout.server_metrics import scrape

logger = logging.getLogger("MARLaaSBenchSampler")


Pids = int | list[int] | None


def _tree(pids: Pids) -> list[psutil.Process]:
    """The live processes of the trees rooted at ``pids``."""
    if pids is None:
        return []
    out = []
    for pid in [pids] if isinstance(pids, int) else pids:
        try:
            root = psutil.Process(pid)
            out += [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
    return out


def tree_cpu_seconds(pids: Pids, system_only: bool = False) -> float:
    """User + system CPU seconds of ``pids`` and their live descendants (threads
    included; a descendant that already exited is no longer counted, so the
    bench keeps the long-lived processes: vLLM's API server and engine core, the
    trainer)."""
    total = 0.0
    for p in _tree(pids):
        try:
            t = p.cpu_times()
            total += t.system if system_only else t.user + t.system
        except psutil.Error:
            continue
    return total


def tree_memory_bytes(pids: Pids) -> int:
    """Proportional set size (PSS: shared pages split among their sharers, so
    processes sharing a model's pages are not counted twice) of ``pids`` and
    their live descendants; RSS where PSS cannot be read."""
    total = 0
    for p in _tree(pids):
        try:
            try:
                total += p.memory_full_info().pss
            except (psutil.AccessDenied, AttributeError):
                total += p.memory_info().rss
        except psutil.Error:
            continue
    return total


def machine_used_bytes() -> int:
    """The machine's memory in use: total - available (what the kernel could
    hand out without swapping)."""
    vm = psutil.virtual_memory()
    return vm.total - vm.available


class UtilizationSampler:
    """``start()`` / ``stop()`` around a run; ``samples`` holds ``{"t",
    "server_cpu", "trainer_cpu", "server_mem", "trainer_mem", "machine_mem",
    "running", "waiting"}`` (CPU cumulative, memory in bytes)."""

    def __init__(
        self,
        server_pid: Pids,
        trainer_pid: Pids,
        address: str | None,
        interval_s: float = 0.5,
    ):
        self.server_pid = server_pid
        self.trainer_pid = trainer_pid
        self.address = address
        self.interval_s = interval_s
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._scrape_errors = 0

    def sample(self) -> dict[str, Any]:
        s: dict[str, Any] = {
            "t": time.time(),
            "server_cpu": tree_cpu_seconds(self.server_pid),
            "trainer_cpu": tree_cpu_seconds(self.trainer_pid),
            "trainer_sys": tree_cpu_seconds(self.trainer_pid, system_only=True),
            "server_mem": tree_memory_bytes(self.server_pid),
            "trainer_mem": tree_memory_bytes(self.trainer_pid),
            "machine_mem": machine_used_bytes(),
        }
        if self.address:
            try:
                m = scrape(self.address, timeout=2.0)
                s["running"] = m.requests_running
                s["waiting"] = m.requests_waiting
            except Exception:  # a slow /metrics must not stop the sampling
                self._scrape_errors += 1
        return s

    def _loop(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            self.samples.append(self.sample())
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - t0)))

    def start(self) -> UtilizationSampler:
        self._thread = threading.Thread(
            target=self._loop, name="marlaas-bench-sampler", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> list[dict[str, Any]]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._scrape_errors:
            logger.warning(f"{self._scrape_errors} /metrics scrapes failed")
        return self.samples
