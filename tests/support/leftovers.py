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


def become_subreaper() -> bool:
    try:
        return ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def own_helpers() -> set[int]:
    """The pids of this process's multiprocessing fork server and resource
    tracker (they end with it)."""
    from multiprocessing import forkserver, resource_tracker

    pids = {
        getattr(forkserver._forkserver, "_forkserver_pid", None),
        getattr(resource_tracker._resource_tracker, "_pid", None),
    }
    return {p for p in pids if p}


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
    """This process's descendants still running after ``wait_s`` (zombies, its
    own forks and multiprocessing helpers aside): pid, parent, the test that
    started it, command line."""
    me = psutil.Process()
    deadline = time.monotonic() + wait_s
    while True:
        left = []
        for p in me.children(recursive=True):
            try:
                if p.status() == psutil.STATUS_ZOMBIE:
                    continue
                # This process's own forks (torch's compile workers share its
                # command line) and multiprocessing helpers end with it; an
                # orphan re-parented here was started by another process.
                if p.ppid() == me.pid and (
                    p.cmdline() == me.cmdline() or p.pid in own_helpers()
                ):
                    continue
                started = tests.during(p.create_time())
                left.append(f"{p.pid} (parent {p.ppid()}, {started}): {_cmdline(p)}")
            except psutil.NoSuchProcess:
                continue
        if not left or time.monotonic() > deadline:
            return [x[:300] for x in left]
        time.sleep(1)
