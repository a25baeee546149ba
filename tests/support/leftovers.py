"""Processes a test session leaves behind. The session's pytest process becomes
a child subreaper (PR_SET_CHILD_SUBREAPER), so a process whose parent died
(a worker of a killed run, a server whose launcher exited) is re-parented to it
instead of to init, where no test would see it."""

from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass, field

import psutil

PR_SET_CHILD_SUBREAPER = 36
# multiprocessing's helpers of this process: they end with it.
OWN_HELPERS = ("multiprocessing.forkserver", "multiprocessing.resource_tracker")


def become_subreaper() -> bool:
    try:
        return ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _cmdline(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return ""


@dataclass
class Tests:
    """When each test of the session ran, to name the one a process came from."""

    windows: list[tuple[str, float, float]] = field(default_factory=list)

    def during(self, t: float) -> str:
        for name, start, end in self.windows:
            if start <= t <= end:
                return name
        return "no test (a session fixture)"


def leftovers(tests: Tests, wait_s: float = 30.0) -> list[str]:
    """This process's descendants still running after ``wait_s`` (zombies and
    its own multiprocessing helpers aside): pid, parent, the test that started
    it, command line."""
    me = psutil.Process()
    deadline = time.monotonic() + wait_s
    while True:
        left = []
        for p in me.children(recursive=True):
            try:
                if p.status() == psutil.STATUS_ZOMBIE:
                    continue
                if p.ppid() == me.pid and any(h in _cmdline(p) for h in OWN_HELPERS):
                    continue
                started = tests.during(p.create_time())
                left.append(f"{p.pid} (parent {p.ppid()}, {started}): {_cmdline(p)}")
            except psutil.NoSuchProcess:
                continue
        if not left or time.monotonic() > deadline:
            return [x[:300] for x in left]
        time.sleep(1)
