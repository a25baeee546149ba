"""Child processes the plugin starts: stopping their whole group, reading logs,
and taking down the parts of a run one after another."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path


def stop_group(
    process: subprocess.Popen, timeout: float = 30.0, graceful: bool = True
) -> None:
    """Stop ``process`` and everything in its process group (it must have been
    started with ``start_new_session=True``, so its pid is the group id):
    SIGTERM, then SIGKILL after ``timeout``; only SIGKILL when not ``graceful``."""
    pgid = process.pid
    for sig in (signal.SIGTERM, signal.SIGKILL) if graceful else (signal.SIGKILL,):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            break
        # A stopped (hung) process only acts on SIGTERM once continued.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGCONT)
        try:
            process.wait(timeout)
            return
        except subprocess.TimeoutExpired:
            continue
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout)


def tail(path: str | Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a text file ("" when unreadable)."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def close_each(parts: Iterable[tuple[str, Callable[[], object]]], logger) -> None:
    """Run every ``(name, stop)`` in order, whatever the ones before it did: a
    part that fails to stop (a worker that a signal already ended cannot be
    told to) is a warning naming it, and the parts after it still stop."""
    for name, stop in parts:
        try:
            stop()
        except Exception as e:
            logger.warning(f"stopping {name}: {type(e).__name__}: {e}")
