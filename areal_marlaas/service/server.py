"""Serve the API with uvicorn in a background thread, so one long-running process
can run the scheduler beside it (``marlaas service``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import uvicorn
from areal.utils import logging

from areal_marlaas.config.service import ServiceConfig
from areal_marlaas.service.api import create_app
from areal_marlaas.service.prometheus import ServiceMetrics
from areal_marlaas.service.router import ModelRouter
from areal_marlaas.service.store import JobStore

logger = logging.getLogger("MARLaaSService")


class ApiServer:
    """A started API server: ``url`` (``http://host:port``, the real port when
    ``service.port`` is 0), ``base_url`` (``.../v1``, for ``openai.OpenAI``),
    ``stop()``; also a context manager."""

    def __init__(self, server: uvicorn.Server, thread: threading.Thread, host: str):
        self._server, self._thread = server, thread
        sock = server.servers[0].sockets[0]
        self.host = host
        self.port: int = sock.getsockname()[1]

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout: float = 10.0) -> None:
        """Finish in-flight requests (up to ``timeout``), then close."""
        self._server.should_exit = True
        self._thread.join(timeout)
        if self._thread.is_alive():
            self._server.force_exit = True
            self._thread.join(timeout)
        logger.info(f"API on {self.url} stopped")

    def __enter__(self) -> ApiServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def run_api(
    cfg: ServiceConfig,
    store: JobStore,
    router: ModelRouter | None = None,
    grader_validator: Callable[[dict], None] | None = None,
    metrics: ServiceMetrics | None = None,
    *,
    grading=None,
    tokenizer=None,
    startup_timeout_s: float = 30.0,
) -> ApiServer:
    """Start serving on ``cfg.host:cfg.port`` and return once it accepts
    connections (raises if it cannot bind)."""
    app = create_app(cfg, store, router, grader_validator, metrics, grading, tokenizer)
    config = uvicorn.Config(
        app,
        host=cfg.host,
        port=cfg.port,
        log_level="warning",
        access_log=False,
        # Signals belong to the hosting process (the scheduler's), not this thread.
        lifespan="on",
    )
    server = uvicorn.Server(config)
    # uvicorn installs signal handlers only in the main thread; none here.
    thread = threading.Thread(target=server.run, name="marlaas-api", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout_s
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError(
                f"API server failed to start on {cfg.host}:{cfg.port} (see the log)"
            )
        if time.monotonic() > deadline:
            server.should_exit = True
            raise TimeoutError(f"API server not up after {startup_timeout_s}s")
        time.sleep(0.05)
    api = ApiServer(server, thread, cfg.host)
    logger.info(f"API serving on {api.base_url}")
    return api
