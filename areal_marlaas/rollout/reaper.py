"""Run a command so that it cannot outlive the process that launched it.

``python reaper.py CMD ARGS...`` (stdlib only: it runs under the vLLM venv's
python). The launcher starts it as a new session, so its process group holds the
command and everything the command forks (vLLM's EngineCore). The reaper stays
as the command's parent and:

* asks the kernel for SIGTERM when its own parent dies (``PR_SET_PDEATHSIG``),
  even by SIGKILL, and then kills its whole process group;
* gives the command ``PR_SET_PDEATHSIG=SIGKILL`` too, in case the reaper itself
  is SIGKILLed;
* forwards SIGTERM/SIGINT, and when the command exits, kills what is left of the
  group (orphaned workers) and exits with the command's status.

PDEATHSIG fires when the launching *thread* exits, so launch from a thread that
lives as long as the server (the main thread, or the supervisor's).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time

PR_SET_PDEATHSIG = 1


def set_pdeathsig(sig: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


def group_members(pgid: int) -> list[int]:
    """Other live processes of process group ``pgid`` (from /proc)."""
    me = os.getpid()
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # Fields after the parenthesized command name: state ppid pgrp ...
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(entry))
    return out


def kill_group(pgid: int, grace_s: float = 5.0) -> None:
    """SIGTERM then SIGKILL every other member of the group."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in group_members(pgid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace_s
        while group_members(pgid) and time.monotonic() < deadline:
            _reap()
            time.sleep(0.1)
        if not group_members(pgid):
            return


def _reap() -> None:
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: reaper.py CMD [ARGS...]", file=sys.stderr)
        return 2
    launcher = os.getppid()
    set_pdeathsig(signal.SIGTERM)
    if os.getppid() != launcher:  # the launcher died before prctl took effect
        return 1
    pgid = os.getpgid(0)
    child = os.fork()
    if child == 0:
        try:
            set_pdeathsig(signal.SIGKILL)
            if os.getppid() == 1:
                os._exit(1)
            os.execvp(argv[0], argv)
        finally:
            os._exit(127)

    stopping = []

    def on_signal(signum, _frame):
        # SIGTERM from the launcher's stop() or from PDEATHSIG: take the group down.
        stopping.append(signum)
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    deadline = None
    while True:
        try:
            pid, status = os.waitpid(child, os.WNOHANG)
        except ChildProcessError:
            status = 0
            break
        if pid == child:
            break
        if os.getppid() != launcher and not stopping:
            on_signal(signal.SIGTERM, None)  # belt and braces for PDEATHSIG
        if stopping and deadline is None:
            deadline = time.monotonic() + 10
        if deadline is not None and time.monotonic() > deadline:
            os.kill(child, signal.SIGKILL)
        time.sleep(0.2)
    kill_group(pgid)
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status)
    return 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
