"""AReaL's remote vLLM engine with one versioned LoRA adapter per tenant task.

AReaL keeps one engine-wide weight version and names adapters
``<lora_name>-v<version>``. Here the version is per task: a request's task is its
``gconfig.lora_name``; the request pins that task's current version for its whole
life, so the payload's ``model`` and the ``output_versions`` of every token come
from the same adapter. Publishing a new version loads a new name and unloads the old
one once its requests drain; the server is never paused.
"""

from __future__ import annotations

import contextvars
import subprocess
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar

import httpx
from areal.api.cli_args import InferenceEngineConfig
from areal.api.io_struct import (
    HttpGenerationResult,
    HttpRequest,
    LocalInfServerInfo,
    ModelRequest,
    ModelResponse,
    WeightUpdateMeta,
)
from areal.api.workflow_api import RolloutWorkflow
from areal.engine.vllm_remote import RemotevLLMEngine, VLLMBackend
from areal.infra.remote_inf_engine import RemoteInfEngine
from areal.utils import logging, name_resolve, names

from areal_marlaas.config.server import RolloutServerConfig
from areal_marlaas.rollout import staging
from areal_marlaas.rollout.gate import without_global_staleness_gate
from areal_marlaas.rollout.platform import resolve_platform
from areal_marlaas.rollout.registry import AdapterRegistry, adapter_name
from areal_marlaas.rollout.seeding import (
    RequestSeeds,
    current_request_seed,
    request_seed,
)
from areal_marlaas.rollout.server import VLLMServer, server_argv, server_env, spawn
from areal_marlaas.trajectory import failure, record_served_adapter
from areal_marlaas.workflows.reward import IsolatedReward

logger = logging.getLogger("MARLaaSRollout")

# The version the current request was pinned to (asyncio tasks copy contexts, so
# concurrent requests of different tasks each see their own).
_PINNED_VERSION: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "marlaas_pinned_version", default=None
)
# The server priority of the current request's task (scheduler.rollout_order).
_PRIORITY: contextvars.ContextVar[int] = contextvars.ContextVar(
    "marlaas_request_priority", default=0
)


class AdapterError(RuntimeError):
    """The server refused to load or unload an adapter."""


class MultiLoRAVLLMBackend(VLLMBackend):
    """VLLMBackend plus the adapter unload request AReaL never sends, the stop
    strings and minimum length it drops (agent workflows stop on closing tags),
    per-request seeds, the adapter name each response reports (the staleness
    audit reads it), and a server launch through the plugin's own path
    (``server.*`` honored)."""

    def __init__(self, server: RolloutServerConfig | None = None):
        super().__init__()
        self.server = server or RolloutServerConfig()

    def build_generation_request(
        self, req: ModelRequest, with_lora: bool, version: int
    ) -> HttpRequest:
        http = super().build_generation_request(req, with_lora, version)
        if req.gconfig.stop:
            http.payload["stop"] = list(req.gconfig.stop)
        if req.gconfig.min_new_tokens:  # AReaL's backend drops it too
            http.payload["min_tokens"] = req.gconfig.min_new_tokens
        seed = current_request_seed()
        if seed is not None:
            http.payload["seed"] = seed
        priority = _PRIORITY.get()
        if priority:  # a server without priority scheduling refuses any other
            http.payload["priority"] = priority
        return http

    def build_lora_load_request(self, name: str, path: str | Path) -> HttpRequest:
        return HttpRequest(
            endpoint="/v1/load_lora_adapter",
            payload={"lora_name": name, "lora_path": str(path)},
        )

    def parse_generation_response(
        self, response: dict[str, Any]
    ) -> HttpGenerationResult:
        record_served_adapter(str(response.get("model", "")))
        return super().parse_generation_response(response)

    def launch_server(self, server_args: dict[str, Any]) -> subprocess.Popen:
        """Start vLLM's own server from the vLLM venv (AReaL's wrapper module
        imports AReaL, which the vLLM venv does not have), under the reaper and
        in its own session, like every server the plugin starts."""
        platform = resolve_platform(self.server)
        argv = server_argv(server_args, self.server, platform)
        logger.info(f"Launching vLLM server: {' '.join(argv)}")
        return spawn(argv, server_env(self.server, platform), self.server)

    def build_lora_unload_request(self, name: str) -> HttpRequest:
        return HttpRequest(
            endpoint="/v1/unload_lora_adapter", payload={"lora_name": name}
        )


class _KeepFailure(RolloutWorkflow):
    """Runs a workflow and keeps why an episode failed: AReaL's executor logs a
    raising workflow and hands back None, which would lose the reason."""

    def __init__(self, workflow: RolloutWorkflow):
        self.workflow = workflow
        self.reason: str | None = None

    async def arun_episode(self, engine, data: dict[str, Any]):
        try:
            traj = await self.workflow.arun_episode(engine, data)
        except Exception as e:
            self.reason = f"{type(e).__name__}: {e}"
            raise
        if traj is None:
            self.reason = f"{type(self.workflow).__name__} returned no trajectory"
        return traj


class MultiLoRARemoteInfEngine(RemoteInfEngine):
    backend: MultiLoRAVLLMBackend  # AReaL's Protocol lacks the LoRA requests

    def __init__(self, config: InferenceEngineConfig, backend: MultiLoRAVLLMBackend):
        if not config.use_lora:
            raise ValueError("rollout.use_lora must be true for multi-LoRA rollout.")
        super().__init__(config, backend)
        self.adapters = AdapterRegistry()
        self.seeds = RequestSeeds()
        self._retire_pool = ThreadPoolExecutor(4, thread_name_prefix="marlaas-retire")
        self._http = httpx.Client()  # thread-safe: retires run on a pool
        self._adapter_lock = threading.Lock()
        self._episodes: dict[int, _KeepFailure] = {}
        self._episodes_lock = threading.Lock()
        self._priorities: dict[str, int] = {}  # task -> its requests' priority
        # Adapter name -> the folder pushed to this node for it (deleted once
        # the name is unloaded).
        self._staged: dict[str, Path] = {}
        # Servers this engine launched on its node (server.launch=workers).
        self.servers: list[VLLMServer] = []

    # -- a server on this worker's node (server.launch=workers) ----------------
    def launch_server(self, server_args: dict[str, Any]) -> LocalInfServerInfo:
        """With a config that carries the server settings
        (``MultiLoRAEngineConfig``), start the plugin's server on this node as
        ``server.*`` says (bind and advertised address, port, platform, cores,
        env, python, start-up timeout) and keep it for supervision; otherwise
        AReaL's launch (``server_args``, a free port on this node's IP)."""
        vllm_cfg = getattr(self.config, "vllm", None)
        server = getattr(self.config, "server", None)
        if vllm_cfg is None or server is None:
            return super().launch_server(server_args)
        base = Path(server.log_file or "vllm_server.log")
        srv = VLLMServer(vllm_cfg.model, vllm_cfg, server, base)
        # One log per server: workers on a shared run directory share the folder.
        tag = srv.address.replace(":", "-")
        srv.log_file = base.with_name(f"{base.stem}-{tag}{base.suffix}")
        srv.start()
        self.servers.append(srv)
        host, port = srv.address.rsplit(":", 1)
        return LocalInfServerInfo(host=host, port=int(port), process=None)

    def initialize(
        self,
        engine_id: str | None = None,
        addr: str | list[str] | None = None,
        train_data_parallel_size: int | None = None,
    ):
        if not addr and self.servers:
            addr = [s.address for s in self.servers]
        return super().initialize(engine_id, addr, train_data_parallel_size)

    def server_exited(self) -> str | None:
        """The supervisor's checks, run on this worker's node."""
        return next(filter(None, (s.exited() for s in self.servers)), None)

    def server_healthy(self, timeout: float) -> bool:
        return all(s.healthy(timeout) for s in self.servers)

    def stop_server(self, timeout: float = 30.0) -> None:
        for s in self.servers:
            s.stop(timeout)

    def start_server(self) -> list[str]:
        """Start the stopped servers again on their ports (adapters are
        reloaded by the caller)."""
        for s in self.servers:
            if not s.alive():
                s.start()
        return [s.address for s in self.servers]

    # -- versions ---------------------------------------------------------------
    def get_version(self) -> int:
        pinned = _PINNED_VERSION.get()
        return super().get_version() if pinned is None else pinned

    def task_version(self, task: str) -> int:
        return self.adapters.version(task)

    def served(self) -> dict[str, tuple[int, str]]:
        """Task -> (published version, adapter folder): what a restarted server
        must load again."""
        return self.adapters.served()

    async def agenerate(self, req: ModelRequest) -> ModelResponse:
        task = req.gconfig.lora_name
        if not self.adapters.has(task):
            # A task this engine was never told about (a plain AReaL trainer that
            # registered `<lora_name>-v0` at server launch): AReaL's semantics,
            # the engine-wide version.
            return await super().agenerate(req)
        with self.adapters.lease(task) as version:
            token = _PINNED_VERSION.set(version)
            rank = _PRIORITY.set(self._priorities.get(task, 0))
            try:
                with request_seed(self.seeds.next(task, version, req.input_ids)):
                    return await super().agenerate(req)
            finally:
                _PRIORITY.reset(rank)
                _PINNED_VERSION.reset(token)

    def set_priority(self, task: str, priority: int) -> None:
        """The server priority of ``task``'s requests from now on (lower is
        served first; the server must run ``--scheduling-policy priority`` for
        any but 0)."""
        self._priorities[task] = int(priority)

    # -- adapters ---------------------------------------------------------------
    def _post(self, addr: str, req: HttpRequest) -> httpx.Response:
        url = f"http://{addr}{req.endpoint}"
        try:
            return self._http.post(
                url, json=req.payload, timeout=self.config.request_timeout
            )
        except httpx.HTTPError as e:
            raise AdapterError(f"{url}: {e}") from e

    def _served_path(self, addr: str, name: str) -> str | None:
        resp = self._http.get(f"http://{addr}/v1/models", timeout=30)
        resp.raise_for_status()
        return next(
            (m.get("root") for m in resp.json()["data"] if m["id"] == name), None
        )

    def load_adapter(self, task: str, version: int, path: str | Path) -> str:
        """Load ``<task>-v<version>`` from ``path`` on every server.

        A name already served from the same folder is left as is (a restarted
        run re-registers its live adapters); one served from another folder (an
        earlier run on a shared server) is replaced, so a name always means these
        weights.
        """
        name = adapter_name(task, version)
        path = str(path)
        if not (Path(path) / "adapter_config.json").is_file():
            raise AdapterError(
                f"{path} is not a PEFT adapter folder (no adapter_config.json)"
            )
        load = self.backend.build_lora_load_request(name, path)
        for addr in self.addresses:
            resp = self._post(addr, load)
            if resp.is_success:
                continue
            if "already been loaded" not in resp.text:
                raise AdapterError(
                    f"{addr} load {name}: HTTP {resp.status_code} {resp.text}"
                )
            if self._served_path(addr, name) == path:
                continue
            logger.warning(f"{addr}: {name} was served from another folder; replacing")
            self._post(addr, self.backend.build_lora_unload_request(name))
            resp = self._post(addr, load)
            if not resp.is_success:
                raise AdapterError(
                    f"{addr} load {name}: HTTP {resp.status_code} {resp.text}"
                )
        return name

    def unload_adapter(self, name: str) -> None:
        unload = self.backend.build_lora_unload_request(name)
        for addr in self.addresses:
            resp = self._post(addr, unload)
            if not resp.is_success and resp.status_code != 404:
                raise AdapterError(
                    f"{addr} unload {name}: HTTP {resp.status_code} {resp.text}"
                )

    def _stage(
        self, task: str, version: int, path: str | Path, files: staging.Files | None
    ) -> str | None:
        """Pushed files (``adapter_transport=push``) written at ``path`` on this
        node; the digest of what is on disk here, read back."""
        if files is None:
            return None
        if staging.stage(path, files):
            self._staged[adapter_name(task, version)] = Path(path)
        return staging.read_digest(path)

    def register_task(
        self,
        task: str,
        version: int,
        path: str | Path,
        files: staging.Files | None = None,
    ) -> str | None:
        """Load a task's starting adapter and route its requests to it; with
        ``files``, first write them at ``path`` on this node (returns their
        digest as read back)."""
        served = self._stage(task, version, path, files)
        self.load_adapter(task, version, path)
        self.adapters.set_current(task, version, str(path))
        return served

    def publish(
        self,
        task: str,
        version: int,
        path: str | Path,
        on_retired: Callable[[str], None] | None = None,
    ) -> Future[str | None]:
        """Serve ``<task>-v<version>`` from ``path`` to all new requests of ``task``.

        Returns once the new name is live; the old name is unloaded in the
        background after its in-flight requests finish (the returned future
        resolves to the retired name). Other tasks are never paused.
        """
        with self._adapter_lock:
            self.load_adapter(task, version, path)
            old = self.adapters.set_current(task, version, str(path))
        logger.info(f"published {adapter_name(task, version)}; retiring {old}")
        if old is None:
            done: Future[str | None] = Future()
            done.set_result(None)
            return done
        return self._retire_pool.submit(self._retire, old, on_retired)

    def _retire(self, name: str, on_retired: Callable[[str], None] | None) -> str:
        if not self.adapters.wait_drained(name, timeout=self.config.request_timeout):
            logger.warning(f"{name} still has requests after the timeout; unloading")
        self.unload_adapter(name)
        self.adapters.mark_retired(name)
        folder = self._staged.pop(name, None)
        if folder is not None:
            staging.unstage(folder)
        logger.info(f"retired {name}")
        if on_retired is not None:
            on_retired(name)
        return name

    def publish_adapter(
        self,
        task: str,
        version: int,
        path: str,
        files: staging.Files | None = None,
    ) -> str | None:
        """``publish`` for RPC callers: returns once the new name is live (the
        digest of the pushed files as this node holds them, if pushed)."""
        served = self._stage(task, version, path, files)
        self.publish(task, version, path)
        return served

    def remove_task(self, task: str) -> None:
        """The task left (finished, cancelled, failed): unload its adapter once
        its requests drain; nothing else is touched."""
        with self._adapter_lock:
            name = self.adapters.forget(task)
        self._priorities.pop(task, None)
        if name is not None:
            self._retire_pool.submit(self._retire, name, None)

    def update_weights_from_disk(self, meta: WeightUpdateMeta) -> Future[None]:
        """AReaL's disk LoRA update path, per task: ``meta.lora_name`` is the task.

        As in AReaL, the trainer announces a finished save through name_resolve;
        the new adapter is published once that key appears.
        """
        version = meta.version
        if not meta.use_lora or version is None:
            raise ValueError("multi-LoRA engines only take versioned LoRA disk updates")
        key = names.update_weights_from_disk(
            self.config.experiment_name, self.config.trial_name, self.get_version()
        )

        def load() -> None:
            name_resolve.wait(key, timeout=self.config.request_timeout)
            assert meta.path is not None  # a disk update names its folder
            self.publish(meta.lora_name, version, meta.path)

        return self._retire_pool.submit(load)

    def pause_generation(self) -> None:
        # A LoRA update is a new adapter name: nothing in flight needs aborting.
        logger.debug("pause_generation ignored: multi-LoRA updates never pause")

    def continue_generation(self) -> None:
        logger.debug("continue_generation ignored: the server is never paused")

    # -- rollouts ---------------------------------------------------------------
    def submit(
        self,
        data: dict[str, Any],
        workflow: Any,
        workflow_kwargs: dict[str, Any] | None = None,
        should_accept_fn: Any = None,
        group_size: int = 1,
        task_id: int | None = None,
        callback_addr: str | None = None,
        is_eval: bool = False,
        proxy_addr: str | None = None,
    ) -> int:
        """AReaL's submit, with the episode's failure reason kept for
        ``wait_for_task`` (the worker-side half of every placement)."""
        resolved = self._resolve_workflow(
            workflow, workflow_kwargs, group_size, proxy_addr=proxy_addr
        )
        episode = _KeepFailure(resolved)
        task_id = super().submit(
            data,
            episode,
            should_accept_fn=should_accept_fn,
            task_id=task_id,
            callback_addr=callback_addr,
            is_eval=is_eval,
            proxy_addr=proxy_addr,
        )
        with self._episodes_lock:
            self._episodes[task_id] = episode
        return task_id

    def wait_for_task(
        self, task_id: int, timeout: float | None = None, raise_timeout: bool = True
    ) -> dict[str, Any] | None:
        """The trajectory, or ``{FAILURE: reason}`` for an episode that failed
        (see ``areal_marlaas.trajectory``); None only while it is still running."""
        result = super().wait_for_task(task_id, timeout, raise_timeout)
        with self._episodes_lock:
            episode = self._episodes.get(task_id)
            done = result is not None or (episode is not None and episode.reason)
            if done:
                self._episodes.pop(task_id, None)
        if result is None and episode is not None and episode.reason:
            return failure(episode.reason)
        return result

    def rollout_task(
        self,
        rows: list[dict[str, Any]],
        workflow: Any,
        workflow_kwargs: dict[str, Any] | None = None,
        group_size: int = 1,
        timeout: float | None = None,
    ) -> list[dict[str, Any]]:
        """One task's batch through the shared executor, waiting only for its own
        episodes (``wait()`` would return other tasks' results too). A failed
        episode is ``{FAILURE: reason}`` in the list."""
        ids = [
            self.submit(row, workflow, workflow_kwargs, group_size=group_size)
            for row in rows
        ]
        out = []
        for i in ids:
            traj = self.wait_for_task(i, timeout=timeout)
            assert traj is not None  # raise_timeout: a timeout raises instead
            out.append(traj)
        return out

    def destroy(self) -> None:
        self._retire_pool.shutdown(wait=False, cancel_futures=True)
        super().destroy()
        self.stop_server()


class MultiLoRAvLLMEngine(RemotevLLMEngine):
    """Drop-in RemotevLLMEngine with per-task versioned adapters.

    ``server``: how a server this engine launches is started (AReaL launches one
    per rollout worker when it is given no server addresses); defaults to
    ``config.server`` when the config carries one (``MultiLoRAEngineConfig``)."""

    # Each task has its own version, so AReaL's one engine-wide staleness gate
    # (rollout.max_head_offpolicyness against get_version()) stays open.
    per_task_versions: ClassVar[bool] = True
    # The multi-task workflows score in IsolatedReward pools in this process.
    warm_rewards: ClassVar[bool] = True

    def __init__(
        self, config: InferenceEngineConfig, server: RolloutServerConfig | None = None
    ):
        from areal_marlaas.train.screen import quiet_if_asked

        quiet_if_asked()
        if self.per_task_versions:
            config = without_global_staleness_gate(config)
        super().__init__(config)
        server = server or getattr(config, "server", None)
        self._engine = MultiLoRARemoteInfEngine(config, MultiLoRAVLLMBackend(server))

    @property
    def adapters(self) -> AdapterRegistry:
        return self._engine.adapters

    @property
    def addresses(self) -> list[str]:
        return self._engine.addresses

    def task_version(self, task: str) -> int:
        return self._engine.task_version(task)

    def served(self) -> dict[str, tuple[int, str]]:
        return self._engine.served()

    def remove_task(self, task: str) -> None:
        self._engine.remove_task(task)

    def set_priority(self, task: str, priority: int) -> None:
        self._engine.set_priority(task, priority)

    def register_task(
        self,
        task: str,
        version: int,
        path: str | Path,
        files: staging.Files | None = None,
    ) -> str | None:
        return self._engine.register_task(task, version, path, files)

    def publish(self, task: str, version: int, path: str | Path, on_retired=None):
        return self._engine.publish(task, version, path, on_retired)

    def initialize(self, *args, **kwargs):
        if self.warm_rewards:
            # Start the reward pools' fork server now, in the background, not
            # on the first tenant's first reward (workflows/reward.py).
            IsolatedReward.warm()
        return super().initialize(*args, **kwargs)

    def rollout_task(
        self, rows, workflow, workflow_kwargs=None, group_size=1, timeout=None
    ):
        return self._engine.rollout_task(
            rows, workflow, workflow_kwargs, group_size, timeout
        )

    def publish_adapter(
        self,
        task: str,
        version: int,
        path: str,
        files: staging.Files | None = None,
    ) -> str | None:
        return self._engine.publish_adapter(task, version, path, files)

    def stage_adapter(self, path: str, files: staging.Files) -> str:
        """Pushed files written at ``path`` on this node (an adapter that is
        loaded by path from elsewhere); their digest as read back."""
        staging.stage(path, files)
        return staging.read_digest(path)

    # What the driver's supervisor asks a rollout worker about its server.
    def server_exited(self) -> str | None:
        return self._engine.server_exited()

    def server_healthy(self, timeout: float) -> bool:
        return self._engine.server_healthy(timeout)

    def stop_server(self, timeout: float = 30.0) -> None:
        self._engine.stop_server(timeout)

    def start_server(self) -> list[str]:
        return self._engine.start_server()

    @classmethod
    def as_controller(cls, config: InferenceEngineConfig, scheduler):
        """Single-controller mode: workers run this engine behind a controller."""
        from areal_marlaas.rollout.controller import MultiTaskRolloutController

        if cls.per_task_versions:
            config = without_global_staleness_gate(config)
        return MultiTaskRolloutController(cls, config=config, scheduler=scheduler)


class SingleTaskvLLMEngine(MultiLoRAvLLMEngine):
    """For AReaL's own trainers (PPOTrainer): one engine-wide version moved by the
    trainer's ``set_version``, and AReaL's staleness gate honored
    (``rollout.max_head_offpolicyness=0`` gives on-policy batches), with the
    plugin's server launch and versioned adapter publishing."""

    per_task_versions: ClassVar[bool] = False
    # AReaL's trainers score with AReaL's own reward wrapper: no fork server
    # (it holds ~1 GB; the replicated-AReaL baseline would carry one each).
    warm_rewards: ClassVar[bool] = False
