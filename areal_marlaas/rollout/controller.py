"""Single-controller (AReaL ``scheduler.type=local|ray|slurm``) version of the
multi-LoRA engine: a RolloutController whose workers run ``MultiLoRAvLLMEngine``."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from areal.api.cli_args import InferenceEngineConfig
from areal.infra.controller.rollout_controller import RolloutController
from areal.infra.utils.concurrent import run_async_task
from areal.utils import logging

from areal_marlaas.rollout import staging

logger = logging.getLogger("MARLaaSRolloutController")


class MultiTaskRolloutController(RolloutController):
    """Fans task registration and publishing out to every rollout worker; each
    worker's engine pins per-task versions for the requests it sends."""

    def __init__(self, inf_engine, config: InferenceEngineConfig, scheduler):
        # The controller-side dispatcher has the same global staleness gate as the
        # worker executors (``as_controller`` opens it for per-task versions).
        super().__init__(inf_engine, config, scheduler)
        self._priorities: dict[str, int] = {}  # as the workers have them
        # adapter_transport=push: send each version's files with the call (the
        # workers' nodes do not see the run directory); each transfer is told
        # to ``on_transfer`` (the run store's events.jsonl).
        self.push = False
        self.on_transfer: Callable[[dict[str, Any]], None] | None = None
        # What the workers serve, as the driver asked: a respawned worker gets it.
        self._current: dict[str, tuple[int, str]] = {}
        self._job = None  # the workers' job, to create them again

    async def _async_initialize(self, job, server_args, server_infos=None, *a, **kw):
        self._job = job
        return await super()._async_initialize(job, server_args, server_infos, *a, **kw)

    def respawn(self) -> None:
        """The rollout workers were lost (their node died): delete them, create
        new ones where the cluster has room now, launch their servers, and load
        every task's current adapter and priority there."""
        assert self._job is not None, "initialize first"
        self.fail_in_flight("the rollout workers were lost")
        forget = getattr(self.scheduler, "forget_workers", None)
        if forget is not None:  # Ray: also free the dead actors' names
            forget(self._worker_role, [w.id for w in self.workers])
        else:
            try:
                self.scheduler.delete_workers(role=self._worker_role)
            except Exception as e:  # a dead worker may not answer its destroy
                logger.warning(f"deleting the lost rollout workers: {e}")
        run_async_task(self._async_initialize, self._job, {}, None)
        for task, (version, path) in self._current.items():
            self._adapter_rpc("register_task", task, version, path)
        for task, priority in self._priorities.items():
            self._collective_rpc("set_priority", task=task, priority=priority)
        logger.info(
            f"rollout workers respawned: servers {self.server_infos}, "
            f"{len(self._current)} adapter(s) loaded"
        )

    def fail_in_flight(self, reason: str) -> int:
        """Fail every episode a worker holds: a lost worker never calls back,
        and AReaL would wait ``rollout.request_timeout`` for it. The episodes
        come back as failed, so their rollouts are redone at the same version.
        Returns how many were failed."""
        with self._futures_lock:
            futures = list(self._pending_futures.values())
            self._pending_futures.clear()
        error = ConnectionError(reason)

        def fail(future) -> None:
            if not future.done():
                future.set_exception(error)

        for future in futures:
            future.get_loop().call_soon_threadsafe(fail, future)
        return len(futures)

    def _adapter_rpc(self, method: str, task: str, version: int, path: str | Path):
        if not self.push:
            self._collective_rpc(method, task=task, version=version, path=str(path))
            self._current[task] = (version, str(path))
            return
        files = staging.served_files(path)
        sent = staging.digest(files)
        start = time.time()
        served = self._collective_rpc(
            method, task=task, version=version, path=str(path), files=files
        )
        end = time.time()
        record = {
            "transfer": "adapter",
            "task": task,
            "version": version,
            "bytes": sum(len(b) for b in files.values()),
            "workers": len(served),
            "start": start,
            "end": end,
            "sha256": sent,
            "served_sha256": served,
        }
        if self.on_transfer is not None:
            self.on_transfer(record)
        if any(d != sent for d in served):
            raise RuntimeError(
                f"{task} v{version}: a rollout worker holds other bytes than "
                f"the trainer wrote (sent {sent[:12]}, workers read back "
                f"{[d[:12] if d else d for d in served]})"
            )
        self._current[task] = (version, str(path))

    def register_task(self, task: str, version: int, path: str | Path) -> None:
        self._adapter_rpc("register_task", task, version, path)

    def stage_files(self, path: str | Path) -> None:
        """Write the adapter at ``path`` (on this machine) at the same path on
        every worker's node, for a caller that loads it there by path (the
        service's chat routes)."""
        files = staging.served_files(path)
        sent = staging.digest(files)
        served = self._collective_rpc("stage_adapter", path=str(path), files=files)
        if any(d != sent for d in served):
            raise RuntimeError(f"{path}: a rollout worker holds other bytes")

    def publish(self, task: str, version: int, path: str | Path) -> None:
        """Make ``<task>-v<version>`` live on every worker's servers."""
        self._adapter_rpc("publish_adapter", task, version, path)

    def served(self) -> dict[str, tuple[int, str]]:
        """Task -> (published version, folder), the same on every worker."""
        views = self._collective_rpc("served")
        first = views[0]
        if any(v != first for v in views[1:]):
            raise RuntimeError(f"rollout workers disagree on what they serve: {views}")
        return {task: tuple(vp) for task, vp in first.items()}

    def remove_task(self, task: str) -> None:
        self._collective_rpc("remove_task", task=task)
        self._priorities.pop(task, None)
        self._current.pop(task, None)

    def set_priority(self, task: str, priority: int) -> None:
        """Every worker sends ``task``'s next requests at ``priority`` (one
        round trip only when it changes: never under rollout_order=fifo)."""
        if self._priorities.get(task, 0) != priority:
            self._collective_rpc("set_priority", task=task, priority=priority)
            self._priorities[task] = priority

    def task_version(self, task: str) -> int:
        versions = set(self._collective_rpc("task_version", task=task))
        if len(versions) != 1:
            raise RuntimeError(
                f"rollout workers disagree on {task}'s version: {versions}"
            )
        return versions.pop()

    def rollout_task(
        self,
        rows: list[dict[str, Any]],
        workflow: str,
        workflow_kwargs: dict[str, Any] | None = None,
        group_size: int = 1,
        timeout: float | None = None,
    ) -> list[dict[str, Any] | None]:
        """One task's batch; waits only for its own episodes. A failed episode is
        ``{FAILURE: reason}`` (the worker's engine keeps the reason)."""
        ids = [
            self.submit(row, workflow, workflow_kwargs, group_size=group_size)
            for row in rows
        ]
        results = [self.dispatcher.wait_for_task(i, timeout) for i in ids]
        return [r.trajectory if r is not None else None for r in results]


class WorkerServers:
    """The servers the rollout workers launched (``server.launch=workers``), as
    the driver's supervisor sees them: every check, stop and restart runs on
    the worker that owns the server, on its node, so a server bound to its
    node's loopback is supervised too."""

    def __init__(self, controller: MultiTaskRolloutController):
        self.controller = controller
        self.lost = False  # a worker stopped answering: start() respawns them

    @property
    def addresses(self) -> list[str]:
        return [f"{i.host}:{i.port}" for i in self.controller.server_infos]

    @property
    def address(self) -> str:
        return ",".join(self.addresses)

    def exited(self) -> str | None:
        try:
            gone = self.controller._collective_rpc("server_exited")
        except Exception as e:  # a lost worker: its server is gone with it
            self.lost = True
            reason = f"rollout worker unreachable: {type(e).__name__}: {e}"
            self.controller.fail_in_flight(reason)
            return reason
        return next(filter(None, gone), None)

    def healthy(self, timeout: float) -> bool:
        try:
            return all(
                self.controller._collective_rpc("server_healthy", timeout=timeout)
            )
        except Exception:
            return False

    def stop(self, timeout: float = 30.0) -> None:
        if not self.lost:
            self.controller._collective_rpc("stop_server", timeout=timeout)

    def start(self) -> str:
        if self.lost:
            self.controller.respawn()
            self.lost = False
        else:
            self.controller._collective_rpc("start_server")
        return self.address
