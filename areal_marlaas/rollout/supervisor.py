"""Keep a launched vLLM server alive: detect death or a hang, restart, reload.

A background thread checks the server every ``health_interval_s``: a process exit
is a fault at once; ``health_failures`` /health calls in a row that fail or take
longer than ``health_timeout_s`` are a hang. On a fault the supervisor kills the
server's process group, starts it again on the same port, reloads every task's
current adapter, and only then reopens the gate that rollouts and publishes wait
on (``wait_ready``). Requests that were in flight fail (their connections drop),
so their rollouts fail and the scheduler retries them at the same version.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from areal.utils import logging

from areal_marlaas.config import FaultToleranceConfig
from areal_marlaas.rollout.server import VLLMServer

if TYPE_CHECKING:
    from areal_marlaas.rollout.controller import WorkerServers

logger = logging.getLogger("MARLaaSSupervisor")


class ServerUnavailableError(RuntimeError):
    """The rollout server is down and could not be brought back in time."""


@dataclass
class Restart:
    """One fault and what it took to recover from it."""

    reason: str
    detected_at: float  # wall clock
    detect_s: float  # from the last good check to detection
    restart_s: float  # kill + start until /health answers
    reload_s: float  # reloading every task's adapter
    adapters: int
    ok: bool = True
    error: str = ""

    @property
    def recovery_s(self) -> float:
        return self.restart_s + self.reload_s


class ServerSupervisor:
    """``server``: a ``VLLMServer`` the driver launched, or the rollout workers'
    servers seen through the workers (``WorkerServers``): both answer
    ``exited()``, ``healthy()``, ``stop()``, ``start()`` and ``address``."""

    def __init__(
        self,
        server: VLLMServer | WorkerServers,
        cfg: FaultToleranceConfig,
        reload: Callable[[], int] | None = None,
        on_restart: Callable[[Restart], None] | None = None,
    ):
        """``reload`` loads every task's current adapter on the fresh server and
        returns how many it loaded; ``on_restart`` is told about each restart."""
        self.server = server
        self.cfg = cfg
        self.reload = reload
        self.on_restart = on_restart
        self.restarts: list[Restart] = []
        self.failed: str = ""
        self._ready = threading.Event()
        self._ready.set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_ok = time.monotonic()

    # -- gate -------------------------------------------------------------------
    @property
    def generation(self) -> int:
        """Bumped at every restart: work that spans a change saw a fault."""
        return len(self.restarts)

    def ready(self) -> bool:
        return self._ready.is_set() and not self.failed

    def wait_ready(self, timeout: float | None = None) -> None:
        """Block while the server restarts; raise if it is gone for good."""
        timeout = self.cfg.restart_wait_s if timeout is None else timeout
        if not self._ready.wait(timeout):
            raise ServerUnavailableError(
                f"rollout server {self.server.address} still restarting after "
                f"{timeout:.0f}s (fault.restart_wait_s)"
            )
        if self.failed:
            raise ServerUnavailableError(self.failed)

    # -- loop -------------------------------------------------------------------
    def start(self) -> ServerSupervisor:
        self._last_ok = time.monotonic()
        self._thread = threading.Thread(
            target=self._loop, name="marlaas-supervisor", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.cfg.health_timeout_s + 5)
            self._thread = None

    def _loop(self) -> None:
        misses = 0
        while not self._stop.wait(self.cfg.health_interval_s):
            reason = self.check(misses)
            if reason is None:
                misses = 0
                self._last_ok = time.monotonic()
                continue
            if reason == "miss":
                misses += 1
                logger.warning(
                    f"{self.server.address} /health missed "
                    f"({misses}/{self.cfg.health_failures})"
                )
                continue
            self.recover(reason)
            misses = 0
            if self.failed:
                return

    def check(self, misses: int = 0) -> str | None:
        """None if healthy, "miss" for one failed /health, else the fault."""
        gone = self.server.exited()
        if gone is not None:
            return f"server process exited ({gone})"
        if self.server.healthy(self.cfg.health_timeout_s):
            return None
        if misses + 1 >= self.cfg.health_failures:
            return f"server hung ({misses + 1} /health checks failed)"
        return "miss"

    def recover(self, reason: str) -> Restart:
        """Restart the server on its port and reload every task's adapter."""
        detected = time.monotonic()
        self._ready.clear()
        logger.error(f"rollout server {self.server.address}: {reason}; restarting")
        record = Restart(reason, time.time(), detected - self._last_ok, 0.0, 0.0, 0)
        if len(self.restarts) >= self.cfg.restart_limit:
            self.failed = (
                f"rollout server {self.server.address}: {reason}, and the "
                f"fault.restart_limit of {self.cfg.restart_limit} restarts is used up"
            )
            logger.error(self.failed)
            self.server.stop()
            self._ready.set()  # wake the waiters: they raise on `failed`
            record.ok, record.error = False, self.failed
            self._report(record)
            return record
        try:
            self.server.stop(timeout=10)
            t0 = time.monotonic()
            self.server.start()
            record.restart_s = time.monotonic() - t0
            t1 = time.monotonic()
            record.adapters = self.reload() if self.reload is not None else 0
            record.reload_s = time.monotonic() - t1
        except Exception as e:  # a failed restart counts; the next check retries
            record.ok, record.error = False, f"{type(e).__name__}: {e}"
            logger.error(f"restart of {self.server.address} failed: {record.error}")
        self.restarts.append(record)
        self._last_ok = time.monotonic()
        if record.ok:
            logger.info(
                f"rollout server {self.server.address} back after "
                f"{record.recovery_s:.1f}s ({record.adapters} adapter(s) reloaded)"
            )
            self._ready.set()
        self._report(record)
        return record

    def _report(self, record: Restart) -> None:
        if self.on_restart is not None:
            try:
                self.on_restart(record)
            except Exception:
                logger.exception("on_restart callback failed")

    def summary(self) -> list[dict]:
        return [{**asdict(r), "recovery_s": r.recovery_s} for r in self.restarts]


class ServerRestartedError(RuntimeError):
    """A rollout overlapped a server fault: redo it at the same version."""


class SupervisedRollout:
    """A rollout backend (in-process engine or controller) behind the supervisor's
    gate: rollouts and publishes wait while the server restarts, a rollout that
    overlapped a fault raises (so the scheduler retries it at the same version),
    and what the backend serves (``served()``) is what a restart reloads."""

    def __init__(self, backend, supervisor: ServerSupervisor):
        self.backend = backend
        self.supervisor = supervisor
        supervisor.reload = self.reload

    def __getattr__(self, name: str):
        return getattr(self.backend, name)

    def register_task(self, task: str, version: int, path) -> None:
        self._across_a_restart(self.backend.register_task, task, version, path)

    def publish(self, task: str, version: int, path, *args, **kwargs):
        return self._across_a_restart(
            self.backend.publish, task, version, path, *args, **kwargs
        )

    def _across_a_restart(self, call, *args, **kwargs):
        """``call`` once the server is ready; if it fails because the server
        went down under it (a lost rollout worker, a dead server), once more on
        the restarted one: the restart reloaded what was served before, so the
        call is still needed, and the task did nothing wrong."""
        sup = self.supervisor
        sup.wait_ready()
        generation = sup.generation
        try:
            return call(*args, **kwargs)
        except Exception as e:
            self._settle(generation)
            if sup.generation == generation:
                raise  # the server is healthy: the call failed for its own reason
            logger.warning(
                f"{getattr(call, '__name__', call)}{args[:2]} overlapped a restart "
                f"of {sup.server.address} ({type(e).__name__}); calling it again"
            )
            return call(*args, **kwargs)

    def reload(self) -> int:
        """Every task's served adapter onto the (restarted) server."""
        served = self.backend.served()
        for task, (version, path) in served.items():
            self.backend.register_task(task, version, path)
        return len(served)

    def rollout_task(self, *args, **kwargs):
        sup = self.supervisor
        sup.wait_ready()
        generation = sup.generation
        try:
            out = self.backend.rollout_task(*args, **kwargs)
        except Exception:
            self._settle(generation)
            raise
        if any(x is None for x in out):
            self._settle(generation)
        if sup.generation != generation:
            raise ServerRestartedError(
                f"rollout server {sup.server.address} restarted during this rollout "
                "(see fault events); retrying it at the same version"
            )
        return out

    def _settle(self, generation: int) -> None:
        """After failed work: if the server is at fault, wait until the
        supervisor has restarted it, so the retry does not fail the same way."""
        sup = self.supervisor
        deadline = time.monotonic() + sup.cfg.restart_wait_s
        while sup.generation == generation and not sup.failed:
            # Healthy, and not mid-restart (a restarted server answers before
            # the restart is counted): the work failed for its own reasons.
            if sup.check() is None and sup.ready() and sup.generation == generation:
                return
            if time.monotonic() > deadline:
                raise ServerUnavailableError(
                    f"rollout server {sup.server.address} unhealthy for "
                    f"{sup.cfg.restart_wait_s:.0f}s (fault.restart_wait_s)"
                )
            time.sleep(0.5)
        sup.wait_ready()
