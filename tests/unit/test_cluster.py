"""Scale-out set-up without a cluster: the placement check's errors, the node
probe, loopback addresses across machines, worker thread counts, the Slurm job
script, the bind/advertised address split, and supervision through workers."""

from __future__ import annotations

import os
import pickle
import stat
import time
from pathlib import Path

import pytest
from areal.api.cli_args import NameResolveConfig, SchedulingSpec
from areal.utils import name_resolve

from areal_marlaas.cluster.resources import GIB, check_placeable, demands
from areal_marlaas.config import ConfigError, FaultToleranceConfig, load_config
from areal_marlaas.config.server import (
    MultiLoRAEngineConfig,
    MultiLoRAvLLMConfig,
    RolloutServerConfig,
)
from areal_marlaas.train.heap import KEEP_ENV
from tests.support.paths import REPO

QUICKSTART = str(REPO / "configs" / "quickstart.yaml")
SMALL = [
    "actor.scheduling_spec.0.cpu=1",
    "actor.scheduling_spec.0.mem=2",
    "rollout.scheduling_spec.0.cpu=1",
    "rollout.scheduling_spec.0.mem=1",
]


def node(ip: str, cpu: float, mem_gib: float, **extra) -> dict:
    return {
        "NodeID": (ip.replace(".", "") + "f" * 40)[:40],
        "NodeManagerAddress": ip,
        "Alive": True,
        "Resources": {"CPU": cpu, "memory": mem_gib * GIB, **extra},
    }


def ray_cfg(*overrides: str):
    cfg, _ = load_config(["--config", QUICKSTART, "scheduler.type=ray", *overrides])
    return cfg


# -- can the cluster hold the workers ----------------------------------------------
def test_areal_default_specs_fail_naming_each_field_and_the_fix():
    # The issue's local head: `ray start --head --num-cpus 2 --num-gpus 0`.
    with pytest.raises(ConfigError) as err:
        check_placeable(demands(ray_cfg()), [node("10.0.0.1", 2, 3.8)])

    msg = str(err.value)
    assert "1 node: 2 CPUs, 3.8 GiB memory" in msg
    for role, what in (("actor", "trainer"), ("rollout", "rollout")):
        assert (
            f"{role}.scheduling_spec.0.cpu=8 cannot be placed: a {what} worker" in msg
        )
        assert f"set {role}.scheduling_spec.0.cpu=2 or less" in msg
        assert f"{role}.scheduling_spec.0.mem=32 cannot be placed" in msg
        assert f"set {role}.scheduling_spec.0.mem=3 or less" in msg


def test_the_issues_small_specs_fit_a_two_cpu_head():
    check_placeable(demands(ray_cfg(*SMALL)), [node("10.0.0.1", 2, 3.8)])


def test_specs_that_fit_alone_but_not_together_name_the_sum():
    cfg = ray_cfg(*SMALL, "actor.scheduling_spec.0.cpu=2")
    with pytest.raises(ConfigError) as err:
        check_placeable(demands(cfg), [node("10.0.0.1", 2, 8)])
    assert "need 3 CPU in all" in str(err.value)
    assert "lower actor.scheduling_spec.0.cpu / rollout.scheduling_spec.0.cpu" in str(
        err.value
    )


def test_two_one_cpu_nodes_hold_one_trainer_and_one_rollout_worker():
    cfg = ray_cfg(*SMALL, "actor.scheduling_spec.0.mem=1")
    nodes = [node("10.0.0.1", 1, 2), node("10.0.0.2", 1, 2)]
    check_placeable(demands(cfg), nodes)
    # Two data-parallel trainer ranks do not fit besides the rollout worker.
    with pytest.raises(ConfigError, match="need 3 CPU in all"):
        check_placeable(demands(ray_cfg(*SMALL, "actor.backend=fsdp:d2")), nodes)


def test_each_trainer_worker_asks_its_own_spec():
    two = demands(ray_cfg(*SMALL, "scheduler.trainers=2"))
    assert [d.what for d in two].count("trainer worker") == 2
    # One trainer and the rollout worker fit two 1-CPU nodes; a second does not.
    nodes = [node("10.0.0.1", 1, 2), node("10.0.0.2", 1, 2)]
    with pytest.raises(ConfigError, match="need 3 CPU in all"):
        check_placeable(two, nodes)


def test_zero_cpu_or_memory_would_hang_areals_probe():
    cfg = ray_cfg(*SMALL, "rollout.scheduling_spec.0.cpu=0")
    with pytest.raises(ConfigError, match=r"rollout.scheduling_spec.0.cpu=0: every"):
        check_placeable(demands(cfg), [node("10.0.0.1", 4, 8)])
    cfg = ray_cfg(*SMALL, "actor.scheduling_spec.0.mem=0")
    with pytest.raises(ConfigError, match=r"set actor.scheduling_spec.0.mem=1"):
        check_placeable(demands(cfg), [node("10.0.0.1", 4, 8)])


def test_gpu_specs_need_a_driver_that_sees_the_accelerator():
    cfg = ray_cfg(*SMALL, "actor.scheduling_spec.0.gpu=1")
    with pytest.raises(ConfigError, match="actor.scheduling_spec.0.gpu=1, but this"):
        check_placeable(demands(cfg), [node("10.0.0.1", 4, 8)], device="CPU")
    with pytest.raises(ConfigError, match=r"scheduling_spec.0.gpu=1 cannot be placed"):
        check_placeable(demands(cfg), [node("10.0.0.1", 4, 8)], device="GPU")
    check_placeable(demands(cfg), [node("10.0.0.1", 4, 8, GPU=1.0)], device="GPU")


def test_shipped_ray_config_loads_and_fits_a_two_cpu_head():
    cfg, _ = load_config(["--config", str(REPO / "configs" / "ray.yaml")])

    assert cfg.scheduler.type == "ray" and cfg.server.launch == "workers"
    assert cfg.server.host == "0.0.0.0" and cfg.server.advertise_host == ""
    assert [t.name for t in cfg.tasks] == ["add2", "mul1", "add1"]  # quickstart's
    assert cfg.cluster.name_resolve.nfs_record_root.startswith(cfg.cluster.fileroot)
    check_placeable(demands(cfg), [node("10.0.0.1", 2, 3.8)])


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["server.launch=workers"], "server.launch=workers needs rollout workers"),
        (
            ["scheduler.type=ray", "server.launch=workers", 'server.addresses=["h:1"]'],
            "set one of them",
        ),
        (["server.advertise_host=0.0.0.0"], "not an address others can dial"),
        (["server.launch=nodes"], "server.launch must be one of"),
        (["scheduler.type=k8s"], "scheduler.type must be local|ray|slurm|null"),
        (["scheduler.startup_timeout_s=0"], "scheduler.startup_timeout_s must be > 0"),
        (["scheduler.slurm.container=docker"], "scheduler.slurm.container must be"),
        (["scheduler.trainers=0"], "scheduler.trainers must be >= 1, got 0"),
        (["scheduler.trainers=2"], "scheduler.trainers=2 runs trainer workers: set"),
        (
            ["scheduler.ray.adapter_transport=nfs"],
            "scheduler.ray.adapter_transport must be one of",
        ),
    ],
)
def test_scale_out_settings_are_validated(overrides, match):
    argv = ["--config", QUICKSTART, "scheduler.type=null", *overrides]
    with pytest.raises(ConfigError, match=match):
        load_config(argv)


# -- what every node must see ------------------------------------------------------
def test_node_probe_names_a_run_dir_that_is_not_shared_and_a_missing_model(tmp_path):
    from areal_marlaas.cluster.ray import _probe

    token = tmp_path / "run" / ".marlaas-node-check-x"
    token.parent.mkdir()
    token.write_text("other")  # this node's own folder, not the driver's
    model = tmp_path / "model"
    model.mkdir()
    checks = [
        ("cluster.fileroot (the run directory)", str(token), "token:mine"),
        ("actor.path", str(model), "model"),
        ("server.python", str(tmp_path / "nopython"), "file"),
        ("tokenizer_path", str(model), "dir"),
    ]

    problems = _probe(checks)

    assert [check for check, _ in problems] == [
        "cluster.fileroot (the run directory)",
        "actor.path",
        "server.python",
    ]
    messages = [m for _, m in problems]
    assert (
        f"{tmp_path / 'run'} is not the driver's (no shared filesystem" in (messages[0])
    )
    assert f"actor.path: {model} is not a model folder" in messages[1]
    assert "server.python:" in messages[2]
    token.write_text("mine")
    (model / "config.json").write_text("{}")
    assert _probe(checks[:2]) == []


UNSHARED = {"n2": "node 10.0.0.2 (n2)"}


@pytest.mark.parametrize(
    "asked, unshared, want",
    [
        ("auto", {}, "shared_fs"),
        ("auto", UNSHARED, "push"),
        ("push", {}, "push"),
        ("push", UNSHARED, "push"),
        ("shared_fs", {}, "shared_fs"),
    ],
)
def test_adapter_transport_follows_what_the_nodes_see(asked, unshared, want):
    from areal_marlaas.cluster.ray import resolve_transport

    cfg = ray_cfg(*SMALL, f"scheduler.ray.adapter_transport={asked}")
    assert resolve_transport(cfg, Path("/runs/x"), unshared) == want


def test_shared_fs_without_a_shared_run_dir_names_the_folder_and_the_fix():
    from areal_marlaas.cluster.ray import resolve_transport

    cfg = ray_cfg(*SMALL, "scheduler.ray.adapter_transport=shared_fs")
    with pytest.raises(ConfigError) as e:
        resolve_transport(cfg, Path("/runs/x"), UNSHARED)
    text = str(e.value)
    assert "adapter_transport=shared_fs needs the run directory /runs/x" in text
    assert "node 10.0.0.2 (n2) does not see it" in text
    assert "set scheduler.ray.adapter_transport=push" in text


def test_loopback_server_addresses_are_refused_across_machines():
    from areal_marlaas.cluster.ray import check_addresses

    two_ips = [node("10.0.0.1", 1, 2), node("10.0.0.2", 1, 2)]
    with pytest.raises(ConfigError, match="server.host / server.advertise_host"):
        check_addresses(ray_cfg(*SMALL), two_ips)
    with pytest.raises(ConfigError, match="server.addresses"):
        check_addresses(ray_cfg('server.addresses=["127.0.0.1:8000"]'), two_ips)
    check_addresses(ray_cfg("server.host=0.0.0.0"), two_ips)
    check_addresses(ray_cfg("server.advertise_host=10.0.0.1"), two_ips)
    # Logical nodes on one machine share its loopback.
    check_addresses(ray_cfg(), [node("10.0.0.1", 1, 2), node("10.0.0.1", 1, 2)])


# -- workers' environment ---------------------------------------------------------
def test_ray_worker_threads_come_from_its_own_spec(monkeypatch):
    from areal_marlaas.cluster.ray import MARLaaSRayScheduler

    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # the driver's, not the worker's
    scheduler = MARLaaSRayScheduler(ray_cfg(*SMALL), connected_here=False)

    env = scheduler._build_env_vars(SchedulingSpec(cpu=3, mem=1))
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "3"
    pinned = SchedulingSpec(cpu=3, mem=1, env_vars={"OMP_NUM_THREADS": "1"})
    assert scheduler._build_env_vars(pinned)["OMP_NUM_THREADS"] == "1"
    assert str(REPO) in env["PYTHONPATH"].split(os.pathsep)  # this checkout


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    """sbatch/scancel stand-ins on PATH; sbatch keeps the script it was given."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in {
        "sbatch": f'cp "$1" {tmp_path}/submitted.sh; echo "Submitted batch job 42"',
        "scancel": "exit 0",
    }.items():
        path = bin_dir / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    yield tmp_path / "submitted.sh"
    name_resolve.reconfigure(NameResolveConfig())


def test_slurm_job_script_runs_the_venvs_python_without_a_container(
    tmp_path, fake_slurm
):
    from areal.api import Job

    from areal_marlaas.cluster import make_scheduler

    root = tmp_path / "shared"
    cfg = ray_cfg(
        "scheduler.type=slurm",
        f"cluster.fileroot={root}",
        f"cluster.name_resolve.nfs_record_root={root}/nr",
        "scheduler.slurm.python=/opt/venvs/areal/bin/python",
        "actor.scheduling_spec.0.cpu=4",
        "actor.scheduling_spec.0.mem=16",
    )
    root.mkdir()
    scheduler = make_scheduler(cfg, root)
    job = Job(replicas=2, tasks=list(cfg.actor.scheduling_spec), role="actor")

    assert scheduler.create_workers(job) == ["actor/0", "actor/1"]

    script = fake_slurm.read_text()
    assert "singularity" not in script and "--mpi=pmi2" not in script
    assert "#SBATCH --ntasks-per-node=2" in script
    assert "#SBATCH --cpus-per-task=4" in script
    assert "#SBATCH --mem=32768M" in script  # 16 GiB x 2 tasks
    assert "/opt/venvs/areal/bin/python -m areal.infra.rpc.rpc_server" in script
    assert f"--fileroot {root}" in script
    assert f"--name-resolve-type nfs --nfs-record-root {root}/nr" in script
    # AReaL's environment reaches the workers (it passes it only to apptainer):
    # this checkout on PYTHONPATH, threads from the spec, not the driver's 7.
    assert "export OMP_NUM_THREADS=4" in script
    assert "export PYTHONPATH=" in script and str(REPO) in script
    # Trainer workers keep the pages they free (train/heap.py), read at start.
    assert "export MALLOC_ARENA_MAX=1" in script
    assert "export MALLOC_MMAP_MAX_=0" in script
    # The config's own spec keeps AReaL's default command.
    spec = cfg.actor.scheduling_spec[0]
    assert spec.cmd == "python -m areal.infra.rpc.rpc_server"
    assert spec.env_vars == KEEP_ENV
    scheduler.close()


@pytest.mark.parametrize("keep", [True, False])
def test_local_trainer_workers_start_with_the_heap_settings(tmp_path, keep):
    from areal_marlaas.cluster import close_scheduler, make_scheduler

    cfg = ray_cfg(
        "scheduler.type=local",
        f"cluster.fileroot={tmp_path}",
        f"keep_freed_pages={str(keep).lower()}",
    )
    scheduler = make_scheduler(cfg, tmp_path)
    try:
        actor = cfg.actor.scheduling_spec[0].env_vars
        assert {k: actor.get(k) for k in KEEP_ENV} == (
            KEEP_ENV if keep else dict.fromkeys(KEEP_ENV)
        )
        # The rollout server (vLLM) keeps glibc's defaults.
        assert not set(KEEP_ENV) & set(cfg.rollout.scheduling_spec[0].env_vars)
    finally:
        close_scheduler(scheduler)


# -- the server: bind vs advertised, launched on workers ------------------------
def test_bind_and_advertised_addresses_are_separate(monkeypatch):
    from areal_marlaas.rollout import server as srv

    monkeypatch.setattr(srv, "gethostip", lambda: "10.1.2.3")
    vllm = MultiLoRAvLLMConfig(model="m")
    default = srv.VLLMServer("m", vllm, RolloutServerConfig(port=8011), "log")
    assert default.address == default.local_address == "127.0.0.1:8011"

    every = srv.VLLMServer(
        "m", vllm, RolloutServerConfig(host="0.0.0.0", port=8011), "log"
    )
    assert every.address == "10.1.2.3:8011"  # what the driver and workers dial
    assert every.local_address == "127.0.0.1:8011"  # this node's health checks
    argv, _ = every.command()
    assert argv[argv.index("--host") + 1] == "0.0.0.0"

    named = RolloutServerConfig(host="0.0.0.0", advertise_host="gpu7", port=8011)
    assert srv.VLLMServer("m", vllm, named, "log").address == "gpu7:8011"


def test_engine_config_carries_the_server_settings_to_workers():
    from areal.infra.rpc.serialization import deserialize_value, serialize_value

    cfg = ray_cfg(*SMALL, "server.launch=workers", "server.cpu_affinity=1")
    carried = MultiLoRAEngineConfig(
        **{k: getattr(cfg.rollout, k) for k in cfg.rollout.__dataclass_fields__},
        server=cfg.server,
        vllm=cfg.vllm,
    )
    # Ray pickles it; AReaL's local scheduler sends it as typed JSON.
    for back in (
        pickle.loads(pickle.dumps(carried)),
        deserialize_value(serialize_value(carried)),
    ):
        assert isinstance(back, MultiLoRAEngineConfig)
        assert back.server == cfg.server and back.vllm.model == cfg.vllm.model
        assert back.backend == cfg.rollout.backend


class FakeController:
    """The rollout controller's fan-out to workers, each owning one server."""

    def __init__(self):
        from areal.api.io_struct import LocalInfServerInfo

        self.server_infos = [
            LocalInfServerInfo(host="10.0.0.2", port=9001, process=None),
            LocalInfServerInfo(host="10.0.0.3", port=9001, process=None),
        ]
        self.exit = [None, None]
        self.calls: list[str] = []
        self.failed: list[str] = []  # fail_in_flight's reasons

    def fail_in_flight(self, reason: str) -> int:
        self.failed.append(reason)
        return 0

    def _collective_rpc(self, method, **kwargs):
        self.calls.append(method)
        if method == "server_exited":
            return list(self.exit)
        if method == "server_healthy":
            return [True, True]
        if method == "start_server":
            self.exit = [None, None]
        return [None, None]


def test_servers_on_workers_are_supervised_through_the_workers():
    from areal_marlaas.rollout.controller import WorkerServers
    from areal_marlaas.rollout.supervisor import ServerSupervisor, SupervisedRollout
    from tests.support.runtime_fakes import FakeBackend

    controller = FakeController()
    servers = WorkerServers(controller)
    backend = FakeBackend()
    sup = ServerSupervisor(servers, FaultToleranceConfig(restart_limit=1))
    rollout = SupervisedRollout(backend, sup)
    rollout.register_task("a", 2, "/x/a/v2")
    assert servers.address == "10.0.0.2:9001,10.0.0.3:9001"
    assert sup.check() is None

    controller.exit[1] = "code -9"  # the second worker's server died
    reason = sup.check()
    assert reason == "server process exited (code -9)"
    backend.loaded.clear()
    record = sup.recover(reason)

    assert record.ok and record.adapters == 1
    assert controller.calls[-3:] == ["server_exited", "stop_server", "start_server"]
    assert backend.loaded == [("a", 2, "/x/a/v2")]  # reloaded onto the servers
    assert sup.check() is None


def test_a_lost_rollout_worker_is_a_server_fault():
    from areal_marlaas.rollout.controller import WorkerServers

    class Lost(FakeController):
        def _collective_rpc(self, method, **kwargs):
            raise RuntimeError("actor died")

    controller = Lost()
    assert "rollout worker unreachable" in WorkerServers(controller).exited()
    # What the dead worker held will never call back: failed at once.
    assert len(controller.failed) == 1


def test_episodes_on_a_lost_worker_fail_at_once_instead_of_waiting_out_the_timeout():
    """The controller's own futures, awaited on their own loop the way AReaL's
    dispatcher awaits a worker's callback."""
    import asyncio
    import threading

    from areal_marlaas.rollout.controller import MultiTaskRolloutController

    controller = MultiTaskRolloutController.__new__(MultiTaskRolloutController)
    controller._futures_lock = threading.Lock()
    controller._pending_futures = {}
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()

    async def wait(task_id: int):
        future = loop.create_future()
        with controller._futures_lock:
            controller._pending_futures[task_id] = future
        try:
            await asyncio.wait_for(future, timeout=60)
        except ConnectionError as e:
            return str(e)
        return "called back"

    waits = [asyncio.run_coroutine_threadsafe(wait(i), loop) for i in range(3)]
    deadline = time.monotonic() + 10
    while len(controller._pending_futures) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert controller.fail_in_flight("node lost") == 3
    assert [w.result(timeout=5) for w in waits] == ["node lost"] * 3
    assert controller._pending_futures == {}
    loop.call_soon_threadsafe(loop.stop)


def test_a_lost_rollout_worker_is_respawned_not_restarted():
    from areal_marlaas.rollout.controller import WorkerServers
    from areal_marlaas.rollout.supervisor import ServerSupervisor

    class Lost(FakeController):
        dead = True
        respawned = 0

        def _collective_rpc(self, method, **kwargs):
            if self.dead:
                raise RuntimeError("actor died with its node")
            return super()._collective_rpc(method, **kwargs)

        def respawn(self):
            self.dead = False
            self.respawned += 1

    controller = Lost()
    sup = ServerSupervisor(WorkerServers(controller), FaultToleranceConfig())
    reason = sup.check()
    assert reason is not None and "rollout worker unreachable" in reason
    record = sup.recover(reason)
    # No stop or start asked of the dead workers: new ones instead.
    assert record.ok and controller.respawned == 1
    assert "stop_server" not in controller.calls
    assert "start_server" not in controller.calls
    assert sup.check() is None


def test_model_paths_exist_for_the_node_checks(model_path):
    from areal_marlaas.cluster.ray import node_checks

    cfg = ray_cfg(*SMALL, "server.launch=workers")
    checks = node_checks(cfg, Path("/run/.token"), "t")
    names = [c[0] for c in checks]
    assert names[0].startswith("cluster.fileroot") and checks[0][2] == "token:t"
    assert {"actor.path", "vllm.model", "server.python", "tokenizer_path"} <= set(names)
    from areal_marlaas.cluster.ray import _probe

    assert _probe(checks[1:]) == []  # this machine has all of it
