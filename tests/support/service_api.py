"""Shared pieces of the service tests: a real store + uvicorn API on a free port,
tenants with official-SDK clients, and DB snapshots for "nothing else changed"."""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest
from sqlalchemy import select
from transformers import AutoTokenizer

from areal_marlaas.config.service import ServiceConfig
from areal_marlaas.paths import default_model_path
from areal_marlaas.service.prometheus import ServiceMetrics
from areal_marlaas.service.server import ApiServer, run_api
from areal_marlaas.service.store import JobStore
from areal_marlaas.service.tables import Checkpoint, Event, File, Job, JobAction

BASE = "SmolLM2-135M-Instruct"
GRADER = {
    "type": "string_check",
    "name": "exact",
    "input": "{{ sample.output_text }}",
    "reference": "{{ item.answer }}",
    "operation": "eq",
}
METHOD = {"type": "reinforcement", "reinforcement": {"grader": GRADER}}


def rows(n: int) -> list[dict]:
    return [
        {
            "messages": [{"role": "user", "content": f"What is {i} + {i}?"}],
            "answer": str(2 * i),
        }
        for i in range(n)
    ]


def jsonl(items: list[dict]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in items).encode()


@dataclass
class Service:
    cfg: ServiceConfig
    store: JobStore
    api: ApiServer
    metrics: ServiceMetrics
    router: object = None

    def tenant(self, prefix: str = "t") -> tuple[str, str, openai.OpenAI]:
        """A fresh tenant: (tenant id, API key, SDK client with only base_url and
        api_key set)."""
        tenant, key = self.store.create_tenant(f"{prefix}{secrets.token_hex(4)}")
        return tenant.id, key, openai.OpenAI(base_url=self.api.base_url, api_key=key)


def start_service(root: Path, make_router=None, **overrides) -> Service:
    """``make_router(store)`` builds the ModelRouter (None: no inference proxy)."""
    cfg = ServiceConfig(root=str(root), port=0, base_model=BASE, **overrides)
    store = JobStore.from_config(cfg)
    metrics = ServiceMetrics(store)
    router = make_router(store) if make_router else None
    # The base model's tokenizer: a supervised job's demonstrations are counted.
    tokenizer = AutoTokenizer.from_pretrained(default_model_path())
    api = run_api(cfg, store, router, metrics=metrics, tokenizer=tokenizer)
    return Service(cfg, store, api, metrics, router)


def service_fixture(**overrides):
    """A module-scoped ``svc`` fixture: one service (``start_service``) per test
    module, stopped after it."""

    @pytest.fixture(scope="module")
    def svc(tmp_path_factory):
        service = start_service(tmp_path_factory.mktemp("svc"), **overrides)
        yield service
        service.api.stop()
        service.store.close()

    return svc


def upload(client: openai.OpenAI, n: int = 6, name: str = "train.jsonl"):
    return client.files.create(file=(name, jsonl(rows(n))), purpose="fine-tune")


def create_job(client: openai.OpenAI, file_id: str, **kw):
    kw.setdefault("method", METHOD)
    return client.fine_tuning.jobs.create(model=BASE, training_file=file_id, **kw)


def snapshot(store: JobStore) -> dict[str, list[tuple]]:
    """Every row of the tables a tenant request could touch, as plain tuples."""
    out = {}
    with store._read() as s:
        for model in (Job, JobAction, Event, Checkpoint, File):
            cols = [c.key for c in model.__mapper__.column_attrs]
            out[model.__tablename__] = [
                tuple(json.dumps(getattr(r, c), sort_keys=True) for c in cols)
                for r in s.scalars(select(model))
            ]
    return out
