"""Tenants and their API keys: creation, rotation, revocation, authentication."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from areal_marlaas.service.store.base import Conflict, NotFound, StoreBase, logger
from areal_marlaas.service.tables import ApiKey, Tenant, new_id

KEY_PREFIX = "sk-marlaas-"
TENANT_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")


@dataclass
class TenantInfo:
    id: str
    name: str
    created_at: float
    disabled: bool
    active_keys: list[str] = field(default_factory=list)  # display prefixes
    weight: float = 1.0


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def new_api_key() -> str:
    """``sk-marlaas-`` + 256 random bits (url-safe base64)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def key_prefix(key: str) -> str:
    return key[: len(KEY_PREFIX) + 4] + "..."


def _check_weight(weight: float) -> None:
    if not (isinstance(weight, int | float) and 0 < weight <= 1000):
        raise ValueError(
            f"weight must be a number in (0, 1000] (a tenant's share of the trainer "
            f"relative to the others'), got {weight!r}"
        )


class TenantStore(StoreBase):
    """The ``tenants`` and ``api_keys`` tables (operator commands, auth)."""

    def create_tenant(self, name: str, weight: float = 1.0) -> tuple[Tenant, str]:
        """A new tenant and its first API key (returned once, stored hashed)."""
        if not TENANT_NAME.match(name or ""):
            raise ValueError(
                f"tenant name {name!r} must match {TENANT_NAME.pattern} (it appears "
                "in model names)."
            )
        _check_weight(weight)
        now = time.time()
        tenant = Tenant(
            id=new_id("org"), name=name, created_at=now, disabled=False, weight=weight
        )
        key = new_api_key()
        try:
            with self._write() as s:
                s.add(tenant)
                s.flush()
                s.add(self._key_row(tenant.id, key, now))
        except IntegrityError as e:
            raise Conflict(f"tenant {name!r} already exists", param="name") from e
        logger.info(f"Tenant {name} ({tenant.id}) created")
        return tenant, key

    @staticmethod
    def _key_row(tenant_id: str, key: str, now: float) -> ApiKey:
        return ApiKey(
            tenant_id=tenant_id,
            key_hash=hash_key(key),
            prefix=key_prefix(key),
            created_at=now,
        )

    def issue_key(self, tenant_name: str) -> str:
        """Another key for an existing tenant (rotation)."""
        key = new_api_key()
        with self._write() as s:
            tenant = self._tenant_by_name(s, tenant_name)
            tenant.disabled = False
            s.add(self._key_row(tenant.id, key, time.time()))
        return key

    @staticmethod
    def _tenant_by_name(s: Session, name: str) -> Tenant:
        tenant = s.scalar(select(Tenant).where(Tenant.name == name))
        if tenant is None:
            raise NotFound("tenant", name)
        return tenant

    def list_tenants(self) -> list[TenantInfo]:
        with self._read() as s:
            out = {
                t.id: TenantInfo(
                    t.id, t.name, t.created_at, t.disabled, weight=t.weight
                )
                for t in s.scalars(select(Tenant).order_by(Tenant.created_at))
            }
            keys = select(ApiKey).where(ApiKey.revoked_at.is_(None))
            for k in s.scalars(keys.order_by(ApiKey.id)):
                out[k.tenant_id].active_keys.append(k.prefix)
        return list(out.values())

    def set_weight(self, tenant_name: str, weight: float) -> Tenant:
        """A tenant's share of the trainer under train_order=fair; its running
        jobs follow at the scheduler's next poll."""
        _check_weight(weight)
        with self._write() as s:
            tenant = self._tenant_by_name(s, tenant_name)
            tenant.weight = weight
        return tenant

    def tenant_weights(self) -> dict[str, float]:
        """Tenant id -> weight."""
        with self._read() as s:
            return {tid: w for tid, w in s.execute(select(Tenant.id, Tenant.weight))}

    def revoke(self, tenant_name: str, prefix: str | None = None) -> int:
        """Revoke a tenant's keys (all, or those whose display prefix starts with
        ``prefix``); without a prefix the tenant is also disabled. Returns the
        number of keys revoked."""
        now = time.time()
        with self._write() as s:
            tenant = self._tenant_by_name(s, tenant_name)
            keys = s.scalars(
                select(ApiKey).where(
                    ApiKey.tenant_id == tenant.id, ApiKey.revoked_at.is_(None)
                )
            ).all()
            hit = [k for k in keys if prefix is None or k.prefix.startswith(prefix)]
            for k in hit:
                k.revoked_at = now
            if prefix is None:
                tenant.disabled = True
        return len(hit)

    def authenticate(self, key: str) -> Tenant | None:
        """The tenant owning an active ``key``, else None."""
        digest = hash_key(key)
        with self._read() as s:
            row = s.execute(
                select(ApiKey, Tenant)
                .join(Tenant, Tenant.id == ApiKey.tenant_id)
                .where(ApiKey.key_hash == digest)
            ).first()
        if row is None:
            return None
        api_key, tenant = row
        # The lookup already matched; compare again in constant time so the
        # decision never rests on a short-circuiting comparison.
        if not hmac.compare_digest(api_key.key_hash, digest):
            return None
        if api_key.revoked_at is not None or tenant.disabled:
            return None
        return tenant

    def tenant(self, tenant_id: str) -> Tenant:
        with self._read() as s:
            tenant = s.get(Tenant, tenant_id)
        if tenant is None:
            raise NotFound("tenant", tenant_id)
        return tenant
