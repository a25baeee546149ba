"""AReaL's LocalScheduler with a quiet screen (the workers' output goes to the
run directory's logs only, not also to the driver's terminal) and workers that
a signal to the driver's process group does not reach.

``kill -- -PGID``, a terminal's Ctrl-C or a process manager's stop signal the
whole group: AReaL starts its workers inside the driver's, so they died with
the signal while the driver drained, failing the step in flight. Here each
worker runs in a session of its own under the reaper that already keeps the
vLLM server from outliving its launcher (``rollout/reaper.py``): the driver
drains and then stops its workers itself, and a driver killed outright still
takes them with it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

from areal.infra.scheduler import local as areal_local
from areal.infra.scheduler.local import LocalScheduler
from areal.infra.utils.proc import build_streaming_log_cmd
from areal.utils import fs as areal_fs

from areal_marlaas.rollout import reaper


class _OneMachine(logging.Filter):
    """LocalScheduler runs every worker on this machine: nothing has to be on a
    shared filesystem, so AReaL's network-filesystem warning does not apply."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "is not on a network filesystem" not in record.getMessage()


def spawn_in_own_session(
    cmd,
    log_file,
    merged_log,
    role: str,
    *,
    env: dict[str, str] | None = None,
    env_vars_in_cmd: dict[str, str] | None = None,
    stdout=None,
) -> subprocess.Popen:
    """AReaL's ``run_with_streaming_logs`` (same command, same logs), started
    as ``reaper.py bash -c CMD`` in a new session. The reaper dies with the
    thread that starts it (PR_SET_PDEATHSIG): workers are created on the
    driver's main thread, which lives as long as the run."""
    shell_cmd = build_streaming_log_cmd(
        cmd, str(log_file), str(merged_log), role, env_vars=env_vars_in_cmd
    )
    return subprocess.Popen(
        [sys.executable, reaper.__file__, "/bin/bash", "-c", shell_cmd],
        env=env,
        stdout=stdout or sys.stdout,
        stderr=stdout or sys.stdout,
        start_new_session=True,
    )


class MARLaaSLocalScheduler(LocalScheduler):
    """Worker logs in ``<run dir>/logs/<role>.log``; with ``quiet`` they reach
    only those files (AReaL tees them to the driver's stdout as well). Each
    worker in its own session, under a reaper (the module's docstring)."""

    def __init__(self, exp_config, run_dir: str | Path, quiet: bool):
        self.quiet = quiet
        fs_log = areal_fs.logger
        if quiet and not any(isinstance(f, _OneMachine) for f in fs_log.filters):
            fs_log.addFilter(_OneMachine())
        super().__init__(log_dir=str(Path(run_dir) / "logs"), exp_config=exp_config)

    def create_workers(self, job, *args, **kwargs) -> list[str]:
        with contextlib.ExitStack() as stack:
            # AReaL's spawn function is a module global of its scheduler, not a
            # method: replaced for this call only.
            stack.enter_context(
                mock.patch.object(
                    areal_local, "run_with_streaming_logs", spawn_in_own_session
                )
            )
            if self.quiet:
                # AReaL spawns each worker with stdout=sys.stdout (read at spawn
                # time); its shell command still tees everything into the
                # role's log file.
                sink = stack.enter_context(open(os.devnull, "w"))
                stack.enter_context(contextlib.redirect_stdout(sink))
            return super().create_workers(job, *args, **kwargs)
