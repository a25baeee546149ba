"""Which upstream server and model name serve a tenant's ``model=``.

:class:`VLLMModelRouter` maps the base model's public name to the vLLM server's
base model, a job's ``fine_tuned_model`` to its newest checkpoint and a
checkpoint's own name to that checkpoint. Checkpoint adapters are loaded on demand
under inference-only names (``serve-<checkpoint id>``), never the trainer's
``<task>-v<N>`` names, so publishing or retiring a training version never pulls an
adapter from under a chat request. At most ``capacity`` of them stay loaded; the
least recently used one with no request in flight is unloaded first.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple, Protocol

import httpx
from areal.utils import logging

from areal_marlaas.service.store import JobStore

logger = logging.getLogger("MARLaaSService")

SERVE_PREFIX = "serve-"


class ModelNotFound(LookupError):
    """The tenant may not use this model (or it does not exist: the same)."""


class UpstreamError(RuntimeError):
    """The model server refused or failed to load an adapter."""


class Route(NamedTuple):
    base_url: str  # OpenAI-style base, e.g. http://127.0.0.1:8001/v1
    model: str  # the name the upstream server knows the model by


class ModelRouter(Protocol):
    def resolve(self, tenant_id: str, model: str) -> Route:
        """The upstream for ``model``; raises :class:`ModelNotFound` for a model
        the tenant may not use. Each resolve is paired with one release."""
        ...

    def release(self, route: Route) -> None:
        """The request that resolved ``route`` is done (its stream included)."""
        ...

    # Optional: ``forget(route) -> bool``, called when the upstream answers 404 for
    # a resolved route; True makes the proxy resolve and send once more.


class _Loaded:
    __slots__ = ("inflight",)

    def __init__(self) -> None:
        self.inflight = 0


class VLLMModelRouter:
    def __init__(
        self,
        store: JobStore,
        vllm_address: str,
        base_model_name: str,
        base_model_path: str,
        capacity: int,
        *,
        timeout: float = 120.0,
        stage: Callable[[Path], None] | None = None,
    ):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        addr = vllm_address.rstrip("/")
        self.server = addr if "://" in addr else f"http://{addr}"
        self.base_url = f"{self.server}/v1"
        self.store = store
        self.base_model_name = base_model_name
        self.base_model_path = base_model_path
        self.capacity = capacity
        self.timeout = timeout
        # The server's node does not see this machine's files: put a
        # checkpoint there before loading it by path.
        self.stage = stage
        self._lock = threading.Lock()
        # serve name -> in-flight count, least recently used first.
        self._loaded: OrderedDict[str, _Loaded] = OrderedDict()
        # One lock per serve name: its load and unload never interleave.
        self._name_locks: dict[str, threading.Lock] = {}

    def loaded(self) -> list[str]:
        """Serve names loaded now, least recently used first."""
        with self._lock:
            return list(self._loaded)

    def _name_lock(self, name: str) -> threading.Lock:
        with self._lock:
            return self._name_locks.setdefault(name, threading.Lock())

    def resolve(self, tenant_id: str, model: str) -> Route:
        if model == self.base_model_name:
            return Route(self.base_url, self.base_model_path)
        ckpt = self.store.checkpoint_for_model(tenant_id, model)
        if ckpt is None:
            raise ModelNotFound(model)
        name = SERVE_PREFIX + ckpt.id
        with self._name_lock(name):
            with self._lock:
                entry = self._loaded.get(name)
                if entry is not None:
                    entry.inflight += 1
                    self._loaded.move_to_end(name)
                    return Route(self.base_url, name)
            self._load(name, self.store.root / ckpt.adapter_path)
            with self._lock:
                entry = _Loaded()
                entry.inflight = 1
                self._loaded[name] = entry
                victims = self._pick_victims()
        self._unload(victims)
        return Route(self.base_url, name)

    def release(self, route: Route) -> None:
        if not route.model.startswith(SERVE_PREFIX):
            return
        with self._lock:
            entry = self._loaded.get(route.model)
            if entry is not None and entry.inflight > 0:
                entry.inflight -= 1
            victims = self._pick_victims()
        self._unload(victims)

    def forget(self, route: Route) -> bool:
        """The server answered 404 for ``route`` (restarted, adapters gone): drop
        it so the next resolve loads it again. True if it was an adapter of ours."""
        with self._lock:
            return self._loaded.pop(route.model, None) is not None

    def _pick_victims(self) -> list[str]:
        """Under ``_lock``: drop idle adapters, oldest first, down to capacity."""
        victims = []
        excess = len(self._loaded) - self.capacity
        for name, entry in list(self._loaded.items()):
            if excess <= 0:
                break
            if entry.inflight == 0:
                del self._loaded[name]
                victims.append(name)
                excess -= 1
        return victims

    def _unload(self, names: list[str]) -> None:
        for name in names:
            with self._name_lock(name):
                with self._lock:
                    if name in self._loaded:
                        continue  # asked for again and reloaded meanwhile
                try:
                    resp = httpx.post(
                        f"{self.server}/v1/unload_lora_adapter",
                        json={"lora_name": name},
                        timeout=self.timeout,
                    )
                except httpx.HTTPError as e:
                    logger.warning(f"unload {name}: {e}")
                    continue
                if not resp.is_success and resp.status_code != 404:
                    logger.warning(
                        f"unload {name}: HTTP {resp.status_code} {resp.text}"
                    )
                else:
                    logger.info(f"Inference adapter {name} unloaded (LRU)")

    def _load(self, name: str, path: Path) -> None:
        if not (path / "adapter_config.json").is_file():
            raise UpstreamError(f"checkpoint adapter {path} is missing")
        if self.stage is not None:
            try:
                self.stage(path)
            except Exception as e:
                raise UpstreamError(f"push {name} to the server's node: {e}") from e
        try:
            resp = httpx.post(
                f"{self.server}/v1/load_lora_adapter",
                json={"lora_name": name, "lora_path": str(path)},
                timeout=self.timeout,
            )
        except httpx.HTTPError as e:
            raise UpstreamError(f"load {name}: {e}") from e
        # Names are unique per checkpoint: one already loaded (a restarted API on
        # a running server) holds the same weights.
        if not resp.is_success and "already been loaded" not in resp.text:
            raise UpstreamError(f"load {name}: HTTP {resp.status_code} {resp.text}")
        logger.info(f"Inference adapter {name} loaded from {path}")
