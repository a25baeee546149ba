"""The rollout side of a run: the shared server (launched or attached) and the
multi-LoRA engine connected to it, with each task's adapter registered."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

from areal.api.cli_args import InferenceEngineConfig
from areal.api.io_struct import LocalInfServerInfo
from areal.utils import logging

from areal_marlaas.config import ConfigError, MARLaaSConfig
from areal_marlaas.config.cluster import AdapterTransport
from areal_marlaas.config.server import MultiLoRAEngineConfig
from areal_marlaas.procs import close_each
from areal_marlaas.rollout.controller import MultiTaskRolloutController, WorkerServers
from areal_marlaas.rollout.engine import MultiLoRAvLLMEngine
from areal_marlaas.rollout.server import VLLMServer, is_healthy
from areal_marlaas.rollout.supervisor import ServerSupervisor, SupervisedRollout

logger = logging.getLogger("MARLaaSRolloutSession")


class RolloutSession:
    """Start (or attach to) the server and connect a multi-LoRA engine."""

    def __init__(self, cfg: MARLaaSConfig, run_dir: str | Path):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.server: VLLMServer | None = None  # launched here (server.launch=driver)
        self.worker_servers: WorkerServers | None = None  # server.launch=workers
        self.engine: MultiLoRAvLLMEngine | MultiTaskRolloutController | None = None
        self.server_start_s: float | None = None
        self.supervisor: ServerSupervisor | None = None
        self.addresses: list[str] = []

    def start(self, scheduler=None) -> MultiLoRAvLLMEngine | MultiTaskRolloutController:
        """Connect an in-process engine, or, given an AReaL scheduler, a controller
        with one rollout worker per server."""
        cfg = self.cfg
        if scheduler is not None and cfg.server.launch == "workers":
            return self._start_on_workers(scheduler)
        if cfg.server.addresses:
            addresses = list(cfg.server.addresses)
        else:
            log = cfg.server.log_file or self.run_dir / "vllm_server.log"
            self.server = VLLMServer(cfg.vllm.model, cfg.vllm, cfg.server, log)
            addresses = [self.server.start()]
            self.server_start_s = self.server.startup_s
        self.addresses = addresses
        engine_cfg: InferenceEngineConfig = cfg.rollout
        t0 = time.monotonic()
        if scheduler is None:
            self.engine = engine = MultiLoRAvLLMEngine(engine_cfg, server=cfg.server)
            engine.initialize(addr=addresses, train_data_parallel_size=1)
        else:
            infos = []
            for addr in addresses:
                host, port = addr.rsplit(":", 1)
                infos.append(
                    LocalInfServerInfo(host=host, port=int(port), process=None)
                )
            engine_cfg = dataclasses.replace(
                engine_cfg, backend=f"vllm:d{len(addresses)}"
            )
            self.engine = engine = MultiLoRAvLLMEngine.as_controller(
                engine_cfg, scheduler
            )
            engine.initialize(role="rollout", server_infos=infos)
        logger.info(f"rollout connected to {addresses} in {time.monotonic() - t0:.1f}s")
        if scheduler is not None:
            self._check_reachable()
        return engine

    def _start_on_workers(self, scheduler) -> MultiTaskRolloutController:
        """Each rollout worker launches its own server on its node (AReaL calls
        the engine's ``launch_server`` when given no server addresses)."""
        cfg = self.cfg
        server = dataclasses.replace(
            cfg.server,
            log_file=cfg.server.log_file or str(self.run_dir / "vllm_server.log"),
        )
        fields = {
            f.name: getattr(cfg.rollout, f.name)
            for f in dataclasses.fields(InferenceEngineConfig)
        }
        engine_cfg = MultiLoRAEngineConfig(**fields, server=server, vllm=cfg.vllm)
        t0 = time.monotonic()
        self.engine = engine = MultiLoRAvLLMEngine.as_controller(engine_cfg, scheduler)
        # The servers' nodes may not see the run directory: send the files.
        transport = getattr(scheduler, "adapter_transport", None)
        engine.push = transport == AdapterTransport.PUSH
        engine.initialize(role="rollout", server_args={})
        self.server_start_s = time.monotonic() - t0
        self.worker_servers = WorkerServers(engine)
        self.addresses = self.worker_servers.addresses
        logger.info(
            f"rollout workers launched servers {self.addresses} in "
            f"{self.server_start_s:.1f}s"
        )
        self._check_reachable()
        return engine

    def _check_reachable(self) -> None:
        """The driver dials every server (KV admission, the service's chat
        routes): fail now, naming the settings, if one is out of its reach."""
        for addr in self.addresses:
            if is_healthy(addr, timeout=10):
                continue
            raise ConfigError(
                f"the rollout server at {addr} is up for its rollout worker but "
                "not reachable from this (driver) process: bind an interface "
                "others can reach (server.host=0.0.0.0) and advertise an address "
                "the driver and the workers route to (server.advertise_host, "
                "default this node's IP)."
            )

    def supervise(self, backend, on_restart=None):
        """``backend`` behind a supervisor of the launched server (restart on
        death/hang, adapters reloaded); attached servers are returned as is."""
        handle = self.server or self.worker_servers
        if handle is None or not self.cfg.fault.supervise_server:
            return backend
        self.supervisor = ServerSupervisor(
            handle, self.cfg.fault, on_restart=on_restart
        )
        wrapped = SupervisedRollout(backend, self.supervisor)
        self.supervisor.start()
        return wrapped

    def stop(self) -> None:
        """Supervisor, engine (and the servers its workers launched), then the
        server this process launched: each stops even if one before it fails."""
        supervisor, engine, server = self.supervisor, self.engine, self.server
        self.supervisor = self.engine = self.worker_servers = self.server = None
        parts: list[tuple[str, Callable[[], object]]] = []
        if supervisor is not None:
            parts.append(("the server supervisor", supervisor.stop))
        if engine is not None:
            parts.append(("the rollout engine", engine.destroy))
        if server is not None:
            parts.append(("the rollout server", server.stop))
        close_each(parts, logger)

    def __enter__(self) -> RolloutSession:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
