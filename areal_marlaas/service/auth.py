"""Who is calling: tenant API keys (``sk-marlaas-...``, stored as sha256 hashes in
``api_keys``) and the operator's admin key (its hash in a file under the service
root). Hashes are compared with ``hmac.compare_digest``."""

from __future__ import annotations

import hmac
import os
from pathlib import Path

from fastapi import Request

from areal_marlaas.service.errors import APIError
from areal_marlaas.service.store import JobStore, hash_key, new_api_key
from areal_marlaas.service.tables import Tenant

ADMIN_PREFIX = "sk-marlaas-admin-"


def bearer_key(request: Request) -> str | None:
    header = request.headers.get("authorization")
    if not header:
        return None
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        return None
    return key.strip()


def _missing() -> APIError:
    return APIError(
        401,
        "You didn't provide an API key. You need to provide your API key in an "
        "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
        code="missing_api_key",
    )


def _incorrect(key: str) -> APIError:
    shown = key[:14] + "*" * 4 + key[-4:] if len(key) > 20 else "*" * 4
    return APIError(
        401, f"Incorrect API key provided: {shown}.", code="invalid_api_key"
    )


def authenticate(store: JobStore, request: Request) -> Tenant:
    """The calling tenant, or a 401 (missing, unknown, revoked key; disabled
    tenant all look alike)."""
    key = bearer_key(request)
    if key is None:
        raise _missing()
    tenant = store.authenticate(key)
    if tenant is None:
        raise _incorrect(key)
    return tenant


def new_admin_key(path: str | Path) -> str:
    """A fresh admin key; its hash replaces the previous one in ``path`` (0600)."""
    key = ADMIN_PREFIX + new_api_key().removeprefix("sk-marlaas-")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(hash_key(key) + "\n")
    os.replace(tmp, path)
    return key


def is_admin(path: str | Path, key: str | None) -> bool:
    if not key:
        return False
    try:
        stored = Path(path).read_text().strip()
    except OSError:
        return False  # no admin key made yet: nobody is admin
    return bool(stored) and hmac.compare_digest(stored, hash_key(key))


def require_admin(path: str | Path, request: Request) -> None:
    key = bearer_key(request)
    if key is None:
        raise _missing()
    if not is_admin(path, key):
        raise _incorrect(key)
