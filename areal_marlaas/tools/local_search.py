"""``search.server_url: auto``: the search server a run starts for itself.

Where: the process that resolves a task's workflow arguments
(``SearchAgentWorkflow.workflow_kwargs``), i.e. the trainer of ``marlaas train``
(and of each ``marlaas bench`` run), the job service, or the rollout/learning
benches. One server per distinct (corpus, workers, latency), on first use, shared
by the tasks that ask for the same one.

Stopped: by ``stop_local_search_servers()`` (``TrainingStack.close``) or at
interpreter exit; and, if the process dies without either (SIGKILL), by the
reaper: the server runs under ``rollout/reaper.py`` in its own session, launched
from a thread that lives as long as the server (PDEATHSIG follows the launching
thread, and benches resolve workflows on short-lived threads).
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from areal.utils import logging

import areal_marlaas
from areal_marlaas.procs import stop_group, tail
from areal_marlaas.rollout.server import free_port, with_reaper

logger = logging.getLogger("MARLaaSLocalSearch")


@dataclass(frozen=True)
class LocalSearchSpec:
    corpus: str
    workers: int = 2
    latency_median_s: float = 0.0
    latency_sigma: float = 0.5
    latency_seed: int | None = None

    def argv(self, host: str, port: int) -> list[str]:
        argv = [
            sys.executable,
            "-m",
            "areal_marlaas.cli",
            "search-server",
            "--corpus",
            self.corpus,
            "--host",
            host,
            "--port",
            str(port),
            "--workers",
            str(self.workers),
            "--latency-median-s",
            f"{self.latency_median_s!r}",
            "--latency-sigma",
            f"{self.latency_sigma!r}",
        ]
        if self.latency_seed is not None:
            argv += ["--latency-seed", str(self.latency_seed)]
        return argv


class LocalSearchServer:
    """One ``marlaas search-server`` child process: ``start()`` blocks until
    ``/health`` answers and returns the URL."""

    def __init__(
        self,
        spec: LocalSearchSpec,
        host: str = "127.0.0.1",
        log_file: str | Path | None = None,
        startup_timeout_s: float = 300.0,
    ):
        self.spec = spec
        self.host = host
        self.port = free_port(host)
        self.url = f"http://{host}:{self.port}"
        self.log_file = Path(
            log_file
            or Path(tempfile.mkdtemp(prefix="marlaas-search-")) / "search_server.log"
        )
        self.startup_timeout_s = startup_timeout_s
        self.process: subprocess.Popen | None = None
        self._release = threading.Event()

    def _launch(self) -> subprocess.Popen:
        """Popen from a thread that stays until ``stop()`` (see the module doc)."""
        env = dict(os.environ)
        root = str(Path(areal_marlaas.__file__).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (root, env.get("PYTHONPATH", "")) if p
        )
        box: dict = {}
        launched = threading.Event()

        def owner() -> None:
            try:
                with open(self.log_file, "ab") as log:
                    box["proc"] = subprocess.Popen(
                        with_reaper(self.spec.argv(self.host, self.port)),
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
            except BaseException as e:  # re-raised by the caller
                box["error"] = e
            finally:
                launched.set()
            self._release.wait()

        threading.Thread(target=owner, name="marlaas-search-owner", daemon=True).start()
        launched.wait()
        if "error" in box:
            raise box["error"]
        return box["proc"]

    def start(self) -> str:
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        logger.info(
            f"starting a search server for {self.spec.corpus} on {self.url} "
            f"(log: {self.log_file})"
        )
        t0 = time.monotonic()
        self.process = self._launch()
        while time.monotonic() - t0 < self.startup_timeout_s:
            if self.process.poll() is not None:
                code = self.process.returncode
                self.stop()
                raise RuntimeError(
                    f"search server exited with code {code} during startup; see "
                    f"{self.log_file}:\n{tail(self.log_file)}"
                )
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    logger.info(
                        f"search server ready on {self.url} in "
                        f"{time.monotonic() - t0:.1f}s"
                    )
                    return self.url
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        self.stop()
        raise TimeoutError(
            f"search server not healthy after {self.startup_timeout_s}s; see "
            f"{self.log_file}:\n{tail(self.log_file)}"
        )

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout: float = 10.0) -> None:
        if self.process is not None:
            stop_group(self.process, timeout)
            self.process = None
            logger.info(f"search server on {self.url} stopped")
        self._release.set()


_SERVERS: dict[LocalSearchSpec, LocalSearchServer] = {}
_LOCK = threading.Lock()


def local_search_server(spec: LocalSearchSpec) -> str:
    """The URL of this process's server for ``spec``, started on first use (and
    again if it died)."""
    with _LOCK:
        server = _SERVERS.get(spec)
        if server is None or not server.alive():
            if server is not None:
                logger.warning(f"search server on {server.url} died; starting another")
                server.stop()
            server = LocalSearchServer(spec)
            server.start()
            _SERVERS[spec] = server
        return server.url


def stop_local_search_servers() -> None:
    """Stop every server this process started (idempotent)."""
    with _LOCK:
        servers = list(_SERVERS.values())
        _SERVERS.clear()
    for server in servers:
        server.stop()


atexit.register(stop_local_search_servers)
