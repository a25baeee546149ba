"""Where the workers run: AReaL's single-controller schedulers
(``scheduler.type=local|ray|slurm``), set up from the config alone.

Modules: ``resources`` (can the cluster hold the worker specs), ``ray`` (join
or start a Ray cluster, start-up checks, AReaL's RayScheduler with failures
reported), ``slurm`` (AReaL's SlurmScheduler without containers)."""

from __future__ import annotations

from pathlib import Path

from areal.utils import logging, name_resolve

logger = logging.getLogger("MARLaaSCluster")


def fit_threads_to_cores(cfg) -> None:
    """Local workers: never more compute threads than this machine's cores
    (AReaL's default spec asks for 8, its OMP_NUM_THREADS, even on 2 cores), and
    several trainer workers split them. Not for Ray or Slurm, where spec.cpu is
    what a worker reserves on its node."""
    import os

    cores = len(os.sched_getaffinity(0))
    trainers = cfg.scheduler.trainers
    for role, share in (("actor", max(1, cores // trainers)), ("rollout", cores)):
        for spec in getattr(cfg, role).scheduling_spec:
            if spec.cpu > share:
                split = ""
                if role == "actor" and trainers > 1:
                    split = f", shared by {trainers} trainer workers"
                logger.info(
                    f"{role}.scheduling_spec cpu={spec.cpu}, {cores} cores here"
                    f"{split}: using {share} threads"
                )
                spec.cpu = share


def make_scheduler(cfg, run_dir: str | Path):
    """The scheduler ``scheduler.type`` names, ready for workers (None for
    in-process engines). ``run_dir`` must exist: Ray checks every node sees it."""
    kind = cfg.scheduler.type
    if kind is None:
        return None
    if cfg.keep_freed_pages:  # read by glibc when each trainer worker starts
        from areal_marlaas.train.heap import KEEP_ENV

        for spec in cfg.actor.scheduling_spec:
            spec.env_vars = {**KEEP_ENV, **(spec.env_vars or {})}
    for spec in cfg.rollout.scheduling_spec:
        # AReaL forces rollouts to "separate" placement, with a warning.
        spec.ray_placement_strategy = "separate"
    resolve = cfg.cluster.name_resolve
    if resolve.type == "nfs":
        Path(resolve.nfs_record_root).mkdir(parents=True, exist_ok=True)
    if kind == "local":
        from areal_marlaas.cluster.local import MARLaaSLocalScheduler

        fit_threads_to_cores(cfg)
        if not cfg.verbose:  # workers' loggers keep warnings and errors only
            from areal_marlaas.train.screen import QUIET_ENV

            for role in ("actor", "rollout"):
                for spec in getattr(cfg, role).scheduling_spec:
                    spec.env_vars = {**(spec.env_vars or {}), QUIET_ENV: "1"}
        return MARLaaSLocalScheduler(cfg, run_dir, quiet=not cfg.verbose)
    if kind == "ray":
        from areal_marlaas.cluster.ray import make_ray_scheduler

        scheduler = make_ray_scheduler(cfg, Path(run_dir))
        # The driver's own lookups (AReaL's RayScheduler configures only the
        # workers); after connecting, so a `ray` store joins this cluster.
        name_resolve.reconfigure(resolve)
        return scheduler
    if kind == "slurm":
        from areal_marlaas.cluster.slurm import MARLaaSSlurmScheduler

        return MARLaaSSlurmScheduler(cfg)  # it configures name_resolve itself
    raise ValueError(f"scheduler.type must be local|ray|slurm|null, got {kind!r}")


def close_scheduler(scheduler) -> None:
    """Delete every worker (and, for Ray, leave a cluster this run joined)."""
    close = getattr(scheduler, "close", None)
    if close is not None:
        close()
    else:
        scheduler.delete_workers(None)
