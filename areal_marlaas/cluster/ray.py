"""``scheduler.type=ray``: AReaL's ``RayScheduler`` on a cluster this module
joins (or starts), after checks that turn AReaL's silent failure modes into
errors naming the field: specs no node can hold, nodes that do not see the run
directory or the model, servers advertised on loopback to other machines,
worker ``configure`` calls that failed."""

from __future__ import annotations

import contextlib
import logging as stdlib_logging
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import ray
import ray.exceptions
from areal.infra.scheduler.exceptions import WorkerCreationError
from areal.infra.scheduler.ray import RayScheduler
from areal.infra.utils.launcher import THREAD_ENV_VARS
from areal.utils import logging
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

import areal_marlaas
from areal_marlaas.cluster.resources import GIB, check_placeable, demands, describe
from areal_marlaas.config.cluster import AdapterTransport
from areal_marlaas.errors import ConfigError
from areal_marlaas.paths import vllm_python
from areal_marlaas.rollout.server import advertised_host, is_loopback

logger = logging.getLogger("MARLaaSRay")

# Role -> its scheduling-spec field, for messages.
SPEC_FIELDS = {"actor": "actor.scheduling_spec", "rollout": "rollout.scheduling_spec"}
RUN_DIR = "cluster.fileroot (the run directory)"


def connect(address: str, log_to_driver: bool = False) -> bool:
    """Join the cluster (``scheduler.ray.address`` semantics); True when this
    call connected, so the caller disconnects when done."""
    if ray.is_initialized():
        return False
    target = address or os.environ.get("RAY_ADDRESS") or None
    ray.init(
        address=target,
        log_to_driver=log_to_driver,
        include_dashboard=False if target in (None, "local") else None,
        configure_logging=False,
    )
    where = ray.get_runtime_context().gcs_address
    logger.info(f"connected to Ray at {where} ({describe(alive_nodes(), 'CPU')})")
    return True


def alive_nodes() -> list[dict[str, Any]]:
    return [n for n in ray.nodes() if n.get("Alive")]


def device_type() -> str:
    """The accelerator resource AReaL's Ray scheduler asks for (it decides by
    what the driver sees)."""
    from areal.infra.utils.ray_placement_group import ray_resource_type

    return ray_resource_type()


def node_checks(cfg, token_file: Path, token: str) -> list[tuple[str, str, str]]:
    """(field, path, kind) the workers need at the driver's paths on every node."""
    checks = [
        (RUN_DIR, str(token_file), f"token:{token}"),
        ("actor.path", cfg.actor.path, "model"),
        ("tokenizer_path", cfg.tokenizer_path, "dir"),
        ("the driver's python (workers run it)", sys.executable, "file"),
        (
            "areal_marlaas (workers import it from the driver's sys.path)",
            str(Path(areal_marlaas.__file__).parent),
            "dir",
        ),
    ]
    if cfg.server.launch == "workers":
        checks.append(("vllm.model", cfg.vllm.model, "model"))
        checks.append(("server.python", cfg.server.python or vllm_python(), "file"))
    return checks


def _probe(checks: list[tuple[str, str, str]]) -> list[tuple[str, str]]:
    """Runs on one node: what is missing there, as (check, message).
    Self-contained (stdlib only) so it runs on a node that lacks areal_marlaas."""
    import os

    problems = []
    for name, path, kind in checks:
        if kind.startswith("token:"):
            try:
                with open(path) as f:
                    same = f.read() == kind[len("token:") :]
            except OSError:
                same = False
            if not same:
                problems.append(
                    (
                        name,
                        f"{name}: {os.path.dirname(path)} is not the driver's (no "
                        "shared filesystem at this path?)",
                    )
                )
        elif kind == "model":
            if not os.path.isfile(os.path.join(path, "config.json")):
                problems.append(
                    (name, f"{name}: {path} is not a model folder (no config.json)")
                )
        elif (kind == "dir" and not os.path.isdir(path)) or (
            kind == "file" and not os.path.isfile(path)
        ):
            problems.append((name, f"{name}: {path} does not exist"))
    return problems


def _where(n: dict[str, Any]) -> str:
    return f"node {n['NodeManagerAddress']} ({n['NodeID'][:8]})"


def check_nodes(
    cfg, run_dir: Path, nodes: list[dict[str, Any]], timeout: float
) -> dict[str, str]:
    """One zero-CPU task per node (so it runs even on a full node) checks that
    what the workers need is there; raise naming the node and the path. Returns
    the nodes (ID -> where) that lack only the shared run directory, which
    ``resolve_transport`` judges."""
    token = uuid.uuid4().hex
    token_file = run_dir / f".marlaas-node-check-{token[:8]}"
    token_file.write_text(token)
    try:
        probe = ray.remote(num_cpus=0)(_probe)
        checks = node_checks(cfg, token_file, token)
        refs = {
            probe.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(
                    n["NodeID"], soft=False
                )
            ).remote(checks): n
            for n in nodes
        }
        ready, pending = ray.wait(list(refs), num_returns=len(refs), timeout=timeout)
        problems: list[str] = []
        unshared: dict[str, str] = {}
        for ref in pending:
            n = refs[ref]
            problems.append(
                f"{_where(n)} did not run the check within "
                f"scheduler.startup_timeout_s={timeout:g}s"
            )
        for ref in ready:
            n = refs[ref]
            for check, message in ray.get(ref):
                if check == RUN_DIR:
                    unshared[n["NodeID"]] = _where(n)
                else:
                    problems.append(f"{_where(n)}: {message}")
    finally:
        token_file.unlink(missing_ok=True)
    if problems:
        raise ConfigError(
            "Ray workers may start on any node, and there they need the model, "
            "venvs and code at the driver's paths (docs/ray.md); missing:\n"
            + "\n".join(f"  - {p}" for p in problems)
            + "\n(scheduler.ray.check_nodes=false skips this check.)"
        )
    return unshared


def resolve_transport(cfg, run_dir: Path, unshared: dict[str, str]) -> AdapterTransport:
    """``scheduler.ray.adapter_transport`` against what the nodes see: auto is
    push where some node lacks the run directory; shared_fs there is refused,
    naming the directory and the fix."""
    asked = AdapterTransport(cfg.scheduler.ray.adapter_transport)
    if not unshared:
        transport = (
            AdapterTransport.SHARED_FS if asked == AdapterTransport.AUTO else asked
        )
    elif asked == AdapterTransport.SHARED_FS:
        raise ConfigError(
            f"scheduler.ray.adapter_transport=shared_fs needs the run directory "
            f"{run_dir} on a filesystem shared by every node, but "
            f"{', '.join(unshared.values())} does not see it (its servers could not "
            f"read the adapters); mount {cfg.cluster.fileroot} at the same path on "
            "every node, or set scheduler.ray.adapter_transport=push (or auto) to "
            "send each adapter version to the servers' nodes."
        )
    else:
        transport = AdapterTransport.PUSH
        logger.info(
            f"the run directory is not shared with {', '.join(unshared.values())}: "
            "adapters are pushed to the rollout workers' nodes"
        )
    return transport


def check_addresses(cfg, nodes: list[dict[str, Any]]) -> None:
    """On machines with several IPs, a loopback server address reaches only
    its own machine."""
    if len({n["NodeManagerAddress"] for n in nodes}) < 2:
        return
    server = cfg.server
    if server.addresses:
        hosts = [(a.rsplit(":", 1)[0], "server.addresses") for a in server.addresses]
    else:
        hosts = [(advertised_host(server), "server.host / server.advertise_host")]
    for host, field in hosts:
        if is_loopback(host):
            raise ConfigError(
                f"{field}: the rollout server would be reached at {host}, a loopback "
                "address, but the Ray cluster spans several machines; bind "
                "server.host=0.0.0.0 and leave server.advertise_host empty (this "
                "node's IP) or set it to a routable address."
            )


class _ExitedAsAsked(stdlib_logging.Filter):
    """AReaL's worker ``destroy`` ends with ``exit_actor()``, so waiting on it
    always "fails" with the actor's intended exit: not a warning worth showing."""

    def filter(self, record: stdlib_logging.LogRecord) -> bool:
        text = record.getMessage()
        return not ("destroy raised ActorDiedError" in text and "exit_actor()" in text)


class MARLaaSRayScheduler(RayScheduler):
    """AReaL's Ray scheduler with failures reported: a placement that times out
    names the spec fields, a worker's ``configure`` is awaited (AReaL fires it
    and forgets), and each worker's thread count comes from its own spec (not
    from the driver's environment)."""

    def __init__(
        self,
        cfg,
        connected_here: bool,
        transport: AdapterTransport = AdapterTransport.SHARED_FS,
        unshared: dict[str, str] | None = None,
    ):
        super().__init__(cfg.scheduler.startup_timeout_s, exp_config=cfg)
        self.connected_here = connected_here
        self.adapter_transport = transport
        # Nodes without the run directory (node ID -> where): no trainer there.
        self.unshared = unshared or {}
        self.run_root = str(cfg.cluster.fileroot)
        areal_logger = stdlib_logging.getLogger("RayScheduler")
        if not any(isinstance(f, _ExitedAsAsked) for f in areal_logger.filters):
            areal_logger.addFilter(_ExitedAsAsked())

    def _build_env_vars(self, spec) -> dict[str, str]:
        env = super()._build_env_vars(spec)
        threads = str(max(1, spec.cpu))
        for var in THREAD_ENV_VARS:
            if var not in (spec.env_vars or {}):
                env[var] = threads
        return env

    def create_workers(self, job, *args, **kwargs) -> list[str]:
        role = job.role
        # Trainer workers past the first are roles actor1, actor2, ...
        base = role.rstrip("0123456789")
        field = SPEC_FIELDS.get(base, f"{base}.scheduling_spec")
        try:
            ids = super().create_workers(job, *args, **kwargs)
        except ray.exceptions.GetTimeoutError as e:
            free = ray.available_resources()
            raise ConfigError(
                f"the {role} workers could not be placed within "
                f"scheduler.startup_timeout_s={self.startup_timeout:g}s: they ask "
                f"{field}.0.cpu={job.tasks[0].cpu} and {field}.0.mem="
                f"{job.tasks[0].mem} GiB each, and the cluster has "
                f"{free.get('CPU', 0):g} CPUs and "
                f"{free.get('memory', 0) / GIB:.1f} GiB free now (other jobs or "
                "leftover placement groups may hold the rest: `ray status`); lower "
                "them, free the cluster, or raise scheduler.startup_timeout_s."
            ) from e
        if base == "actor":
            self._check_trainer_nodes(role)
        for rank, wi in enumerate(self._workers.get(role, [])):
            try:
                ray.get(
                    wi.actor.configure.remote(self.exp_config, role, rank),
                    timeout=self.startup_timeout,
                )
            except Exception as e:
                raise WorkerCreationError(
                    wi.worker.id, "configure failed on the worker", str(e)
                ) from e
        return ids

    def _check_trainer_nodes(self, role: str) -> None:
        """Trainers write adapters and optimizer state into the run directory
        and the driver reads them there (resume, checkpoints, pushes): a trainer
        placed on a node without it is refused."""
        if not self.unshared:
            return
        from ray.util import placement_group_table

        for wi in self._workers.get(role, []):
            table = placement_group_table(wi.placement_group)
            node = table["bundles_to_node_id"][wi.bundle_index or 0]
            if node in self.unshared:
                raise ConfigError(
                    f"trainer worker {wi.worker.id} was placed on "
                    f"{self.unshared[node]}, which does not see the run directory "
                    f"({self.run_root}); trainers write adapters "
                    "and optimizer state there. Run marlaas on the trainer's node, "
                    "share the run directory with it, or size actor.scheduling_spec "
                    "so only nodes that see it can hold a trainer."
                )

    def forget_workers(self, role: str, ids: list[str]) -> None:
        """Workers lost with their node: drop them, and wait until Ray has
        released their actor names (it keeps a name until it marks the actor
        dead), so new workers can take the same names."""
        try:
            self.delete_workers(role)
        except Exception as e:  # dead actors may not answer their destroy
            logger.warning(f"deleting lost {role} workers: {e}")
        deadline = time.monotonic() + self.startup_timeout
        for name in ids:
            while time.monotonic() < deadline:
                try:
                    actor = ray.get_actor(name)
                except ValueError:
                    break  # the name is free
                with contextlib.suppress(Exception):  # dead already
                    ray.kill(actor, no_restart=True)
                time.sleep(1)

    def close(self) -> None:
        self.delete_workers(None)
        if self.connected_here and ray.is_initialized():
            ray.shutdown()


def make_ray_scheduler(cfg, run_dir: Path) -> MARLaaSRayScheduler:
    settings = cfg.scheduler.ray
    connected = connect(settings.address, settings.log_to_driver)
    try:
        nodes = alive_nodes()
        check_placeable(demands(cfg), nodes, device_type())
        check_addresses(cfg, nodes)
        unshared: dict[str, str] = {}
        if settings.check_nodes:
            unshared = check_nodes(cfg, run_dir, nodes, cfg.scheduler.startup_timeout_s)
        transport = resolve_transport(cfg, run_dir, unshared)
        return MARLaaSRayScheduler(cfg, connected, transport, unshared)
    except BaseException:
        if connected:
            ray.shutdown()
        raise
