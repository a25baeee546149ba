"""What every route needs: the app's shared state and the calling tenant."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import Request

from areal_marlaas.config.service import ServiceConfig
from areal_marlaas.graders import GradingContext
from areal_marlaas.service.auth import authenticate
from areal_marlaas.service.prometheus import ServiceMetrics
from areal_marlaas.service.router import ModelRouter
from areal_marlaas.service.store import JobStore
from areal_marlaas.service.tables import Tenant


@dataclass
class AppState:
    cfg: ServiceConfig
    store: JobStore
    router: ModelRouter | None
    grader_validator: Callable[[dict], None]
    metrics: ServiceMetrics
    grading: GradingContext
    # The base model's tokenizer (demonstrations' lengths); None: not counted.
    tokenizer: Any = None


def state(request: Request) -> AppState:
    return request.app.state.marlaas


def tenant_of(request: Request) -> Tenant:
    """FastAPI dependency: the tenant of the request's bearer key, else 401."""
    return authenticate(state(request).store, request)
