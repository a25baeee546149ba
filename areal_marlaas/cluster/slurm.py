"""``scheduler.type=slurm``: AReaL's ``SlurmScheduler`` without containers by
default: the workers run the venv's python on the compute nodes, with the
environment AReaL computes for them exported in the job script (AReaL passes
it only to apptainer), and a thread count from each worker's own spec."""

from __future__ import annotations

import dataclasses
import shlex
import sys

from areal.infra.scheduler.slurm import SlurmScheduler
from areal.infra.utils.launcher import THREAD_ENV_VARS
from areal.utils import logging

logger = logging.getLogger("MARLaaSSlurm")

RPC_MODULE = "areal.infra.rpc.rpc_server"


class MARLaaSSlurmScheduler(SlurmScheduler):
    def __init__(self, cfg):
        settings = cfg.scheduler.slurm
        super().__init__(
            exp_config=cfg,
            container_type=settings.container,
            container_mounts=settings.mounts or None,
            srun_additional_args=settings.srun_args,
            startup_timeout=cfg.scheduler.startup_timeout_s,
        )
        self.python = settings.python or sys.executable

    def _prepare_worker_specs(self, role, num_workers, schedulings):
        # Copies: AReaL adds its environment to the specs it is given, which
        # here are the config's own.
        own = []
        for spec in schedulings or []:
            env = dict(spec.env_vars or {})
            for var in THREAD_ENV_VARS:  # from this worker's cpu, not the driver's
                env.setdefault(var, str(max(1, spec.cpu)))
            own.append(
                dataclasses.replace(
                    spec,
                    env_vars=env,
                    cmd=self._command(spec.cmd),
                    additional_bash_cmds=list(spec.additional_bash_cmds or []),
                )
            )
        specs = super()._prepare_worker_specs(role, num_workers, own)
        if self.container_type != "apptainer":
            for spec in {id(s): s for s in specs}.values():
                exports = [
                    f"export {k}={shlex.quote(str(v))}"
                    for k, v in spec.env_vars.items()
                ]
                assert spec.additional_bash_cmds is not None  # a list in the copies
                spec.additional_bash_cmds = exports + spec.additional_bash_cmds
        return specs

    def _command(self, cmd: str | None) -> str:
        """The workers' command with a bare ``python`` (AReaL's default, found
        on the node's PATH) replaced by the configured interpreter."""
        argv = shlex.split(cmd or f"python -m {RPC_MODULE}")
        if argv[0] in ("python", "python3"):
            argv[0] = self.python
        return shlex.join(argv)

    def close(self) -> None:
        self.delete_workers(None)
