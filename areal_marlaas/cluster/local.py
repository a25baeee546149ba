"""AReaL's LocalScheduler with a quiet screen: the workers' output goes to the
run directory's logs only, not also to the driver's terminal."""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

from areal.infra.scheduler.local import LocalScheduler
from areal.utils import fs as areal_fs


class _OneMachine(logging.Filter):
    """LocalScheduler runs every worker on this machine: nothing has to be on a
    shared filesystem, so AReaL's network-filesystem warning does not apply."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "is not on a network filesystem" not in record.getMessage()


class MARLaaSLocalScheduler(LocalScheduler):
    """Worker logs in ``<run dir>/logs/<role>.log``; with ``quiet`` they reach
    only those files (AReaL tees them to the driver's stdout as well)."""

    def __init__(self, exp_config, run_dir: str | Path, quiet: bool):
        self.quiet = quiet
        fs_log = areal_fs.logger
        if quiet and not any(isinstance(f, _OneMachine) for f in fs_log.filters):
            fs_log.addFilter(_OneMachine())
        super().__init__(log_dir=str(Path(run_dir) / "logs"), exp_config=exp_config)

    def create_workers(self, job, *args, **kwargs) -> list[str]:
        if not self.quiet:
            return super().create_workers(job, *args, **kwargs)
        # AReaL spawns each worker with stdout=sys.stdout (read at spawn time);
        # its shell command still tees everything into the role's log file.
        with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
            return super().create_workers(job, *args, **kwargs)
