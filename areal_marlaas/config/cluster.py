"""Settings of AReaL's cluster schedulers as MARLaaS uses them: Ray
(``scheduler.ray.*``) and Slurm (``scheduler.slurm.*``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from areal_marlaas.errors import ConfigError

SLURM_CONTAINERS = ("none", "apptainer")


class AdapterTransport(StrEnum):
    """How a committed adapter reaches the vLLM servers on other nodes."""

    SHARED_FS = "shared_fs"  # the servers read the run directory (one mount)
    PUSH = "push"  # its files go to each server's node, written there
    AUTO = "auto"  # push when the start-up check finds the run dir not shared


@dataclass
class RayClusterConfig:
    """Which Ray cluster ``scheduler.type=ray`` runs on, and the start-up checks."""

    address: str = field(
        default="",
        metadata={
            "help": "Ray cluster to join: host:port of its head (GCS), 'auto' (a "
            "cluster started with `ray start` on this machine, required), or "
            "'local' (always start a private one-machine cluster). Empty = "
            "$RAY_ADDRESS, else a cluster started on this machine, else a private "
            "one."
        },
    )
    check_nodes: bool = field(
        default=True,
        metadata={
            "help": "Before any worker starts, run a task on every node that checks "
            "the run directory, the model, this Python and areal_marlaas (and the "
            "vLLM Python when servers start on workers) are there at the driver's "
            "paths; fail naming the node and the path."
        },
    )
    log_to_driver: bool = field(
        default=False,
        metadata={
            "help": "Print the workers' output on the driver's screen; false = "
            "it stays in Ray's session logs (/tmp/ray/session_latest/logs)."
        },
    )
    adapter_transport: str = field(
        default=AdapterTransport.AUTO.value,
        metadata={
            "help": "How adapters reach servers on other nodes: shared_fs (the "
            "run directory is mounted at the same path on every node), push (the "
            "driver sends each version's files to every rollout worker, which "
            "writes them on its node and deletes them once unloaded; trainers "
            "must still run where the run directory is), auto (push when the "
            "start-up check finds a node without the run directory).",
            "choices": [t.value for t in AdapterTransport],
        },
    )

    def __post_init__(self):
        try:
            AdapterTransport(self.adapter_transport)
        except ValueError:
            raise ConfigError(
                "scheduler.ray.adapter_transport must be one of "
                f"{[t.value for t in AdapterTransport]}, got "
                f"{self.adapter_transport!r}."
            ) from None


@dataclass
class SlurmClusterConfig:
    """How ``scheduler.type=slurm`` starts its workers with sbatch/srun."""

    python: str = field(
        default="",
        metadata={
            "help": "Python that runs the workers on the compute nodes (the AReaL "
            "venv's, at the same path on every node). Empty = the python running "
            "marlaas. Used as the workers' command unless a scheduling_spec sets "
            "cmd."
        },
    )
    container: str = field(
        default="none",
        metadata={
            "help": "none: run the venv's python on the node (AReaL's default is "
            "apptainer, which needs scheduling_spec.image).",
            "choices": list(SLURM_CONTAINERS),
        },
    )
    mounts: str = field(
        default="",
        metadata={"help": "apptainer only: --bind mounts, e.g. /storage:/storage."},
    )
    srun_args: str = field(
        default="--unbuffered -K --chdir $PWD",
        metadata={
            "help": "Extra srun arguments (AReaL's default adds --mpi=pmi2, which "
            "clusters without PMI2 refuse)."
        },
    )

    def __post_init__(self):
        if self.container not in SLURM_CONTAINERS:
            raise ConfigError(
                f"scheduler.slurm.container must be one of {list(SLURM_CONTAINERS)}, "
                f"got {self.container!r}."
            )
