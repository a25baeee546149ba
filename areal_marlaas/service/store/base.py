"""What every part of the job store shares: the engine, one-transaction sessions,
the refusals the API maps to HTTP errors, and the queries several parts run
inside their transactions."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, Self, TypeVar

from areal.utils import logging
from sqlalchemy import Select, select
from sqlalchemy.orm import Session

from areal_marlaas.service.db import WRITE, make_engine, upgrade_to_head
from areal_marlaas.service.tables import Tenant

logger = logging.getLogger("MARLaaSService")

T = TypeVar("T")


class StoreError(Exception):
    """Base of the store's refusals; the API maps each to an HTTP error."""


class NotFound(StoreError):
    def __init__(self, kind: str, ident: str, param: str | None = None):
        super().__init__(f"No such {kind}: {ident}")
        self.kind, self.ident, self.param = kind, ident, param


class Conflict(StoreError):
    """The request contradicts the stored state (reused idempotency key, a file
    in use); retrying it unchanged cannot succeed."""

    def __init__(self, message: str, param: str | None = None, code: str = "conflict"):
        super().__init__(message)
        self.param, self.code = param, code


class LimitExceeded(StoreError):
    """A per-tenant quota (jobs, files) is full."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class InvalidAction(StoreError):
    """A cancel/pause/resume request that the job's state does not allow."""


class InvalidTransition(StoreError):
    """A scheduler-side status change the job's state does not allow."""


@dataclass
class Page(Generic[T]):
    items: list[T]
    has_more: bool


class StoreBase:
    """SQL job store at ``url``; file bodies and adapters live under ``root``."""

    def __init__(self, url: str, root: str | Path, *, migrate: bool = True):
        self.url = url
        self.root = Path(root).expanduser().absolute()
        self.root.mkdir(parents=True, exist_ok=True)
        self.engine = make_engine(url)
        if migrate:
            upgrade_to_head(self.engine)
        self._writer = self.engine.execution_options(**{WRITE: True})

    @classmethod
    def from_config(cls, cfg, *, migrate: bool = True) -> Self:
        """From a ``ServiceConfig`` (its root and DB URL)."""
        return cls(cfg.database_url, cfg.root_dir, migrate=migrate)

    def close(self) -> None:
        self.engine.dispose()

    @contextmanager
    def _read(self) -> Iterator[Session]:
        with Session(self.engine, expire_on_commit=False) as s, s.begin():
            yield s

    @contextmanager
    def _write(self) -> Iterator[Session]:
        with Session(self._writer, expire_on_commit=False) as s, s.begin():
            yield s

    # -- queries inside a caller's transaction ---------------------------------------
    @staticmethod
    def _lock_tenant(s: Session, tenant_id: str) -> None:
        # Serializes a tenant's limit check + insert on PostgreSQL; on SQLite the
        # IMMEDIATE transaction already does (FOR UPDATE is not rendered there).
        s.execute(select(Tenant.id).where(Tenant.id == tenant_id).with_for_update())

    @staticmethod
    def _cursor_seq(s: Session, model, tenant_id: str, after: str, kind: str) -> int:
        # A cursor is looked up in the tenant's own rows only (deleted ones too, so
        # paging survives a delete); anything else is "no such" for the `after` param.
        seq = s.scalar(
            select(model.seq).where(model.id == after, model.tenant_id == tenant_id)
        )
        if seq is None:
            raise NotFound(kind, after, param="after")
        return seq

    @staticmethod
    def _page(s: Session, q: Select, limit: int) -> Page:
        rows = list(s.scalars(q.limit(limit + 1)))
        return Page(rows[:limit], len(rows) > limit)
