"""Tenants' webhooks (the operator's) and their delivery log (the dispatcher's).

Events are an outbox: :func:`enqueue_job_event` adds one ``webhook_deliveries``
row per webhook inside the transaction that finishes the job, so a crash either
loses both or neither. The dispatcher (``service/webhooks.py``) claims due rows,
POSTs them outside any transaction and records each attempt here.
"""

from __future__ import annotations

import base64
import binascii
import json
import secrets
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from sqlalchemy import select
from sqlalchemy.orm import Session

from areal_marlaas.service.store.base import NotFound, StoreBase, logger
from areal_marlaas.service.tables import (
    DELIVERY_CANCELLED,
    DELIVERY_DELIVERED,
    DELIVERY_FAILED,
    DELIVERY_PENDING,
    Job,
    Tenant,
    Webhook,
    WebhookAttempt,
    WebhookDelivery,
)

SECRET_PREFIX = "whsec_"
# Standard Webhooks: secrets of 24 to 64 random bytes.
SECRET_BYTES = (24, 64)


def new_secret() -> str:
    """``whsec_`` + base64 of 32 random bytes (Standard Webhooks' format)."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def check_secret(secret: str) -> None:
    lo, hi = SECRET_BYTES
    fix = "or leave --secret out to have one generated"
    if not secret.startswith(SECRET_PREFIX):
        raise ValueError(f"--secret must start with {SECRET_PREFIX!r}; {fix}.")
    try:
        key = base64.b64decode(secret[len(SECRET_PREFIX) :], validate=True)
    except binascii.Error as e:
        raise ValueError(
            f"--secret must be {SECRET_PREFIX} followed by base64 ({e}); {fix}."
        ) from e
    if not lo <= len(key) <= hi:
        raise ValueError(
            f"--secret must decode to {lo}..{hi} bytes, got {len(key)}; {fix}."
        )


def check_url(url: str) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(
            f"--url {url!r} is not an http:// or https:// URL with a host; give the "
            "receiver's full address, e.g. --url https://hooks.example.com/marlaas."
        )


def job_event(job: Job, status: str, now: float) -> tuple[str, str, str]:
    """``(event id, type, body)`` of a job's terminal event, in the shape of the
    openai SDK's ``FineTuningJob*WebhookEvent``."""
    event_id = f"evt_{secrets.token_hex(12)}"
    kind = f"fine_tuning.job.{status}"
    body = {
        "id": event_id,
        "object": "event",
        "type": kind,
        "created_at": int(now),
        "data": {"id": job.id},
    }
    return event_id, kind, json.dumps(body, separators=(",", ":"))


def enqueue_job_event(s: Session, job: Job, status: str, now: float) -> int:
    """Inside the caller's transaction: one pending delivery per live webhook of
    the job's tenant. Returns how many."""
    hooks = s.scalars(
        select(Webhook.id).where(
            Webhook.tenant_id == job.tenant_id, Webhook.deleted_at.is_(None)
        )
    ).all()
    if not hooks:
        return 0
    event_id, kind, body = job_event(job, status, now)
    for hook_id in hooks:
        s.add(
            WebhookDelivery(
                message_id=f"msg_{secrets.token_hex(12)}",
                event_id=event_id,
                webhook_id=hook_id,
                tenant_id=job.tenant_id,
                job_id=job.id,
                event_type=kind,
                payload=body,
                status=DELIVERY_PENDING,
                attempts=0,
                created_at=now,
                next_attempt_at=now,
            )
        )
    return len(hooks)


@dataclass
class Claimed:
    """A delivery a dispatcher thread holds for one attempt (a plain snapshot:
    no session needed while the POST runs)."""

    id: int
    message_id: str
    url: str
    secret: str
    payload: str
    attempts: int  # before this one


class WebhookStore(StoreBase):
    """The ``webhooks``, ``webhook_deliveries`` and ``webhook_attempts`` tables."""

    # -- the operator's ------------------------------------------------------------
    def add_webhook(
        self, tenant_name: str, url: str, secret: str | None = None
    ) -> Webhook:
        check_url(url)
        if secret is not None:
            check_secret(secret)
        with self._write() as s:
            tenant_id = self._tenant_id(s, tenant_name)
            hook = Webhook(
                id=f"wh_{secrets.token_hex(12)}",
                tenant_id=tenant_id,
                url=url,
                secret=secret or new_secret(),
                created_at=time.time(),
            )
            s.add(hook)
        logger.info(f"Webhook {hook.id} of tenant {tenant_name} -> {url} added")
        return hook

    def list_webhooks(self, tenant_name: str) -> list[Webhook]:
        with self._read() as s:
            tenant_id = self._tenant_id(s, tenant_name)
            return list(
                s.scalars(
                    select(Webhook)
                    .where(Webhook.tenant_id == tenant_id, Webhook.deleted_at.is_(None))
                    .order_by(Webhook.seq)
                )
            )

    def remove_webhook(self, tenant_name: str, webhook_id: str) -> int:
        """Remove a tenant's webhook; its pending deliveries are cancelled (their
        count is returned). Another tenant's webhook is :class:`NotFound`."""
        now = time.time()
        with self._write() as s:
            tenant_id = self._tenant_id(s, tenant_name)
            hook = s.scalar(
                select(Webhook).where(
                    Webhook.id == webhook_id,
                    Webhook.tenant_id == tenant_id,
                    Webhook.deleted_at.is_(None),
                )
            )
            if hook is None:
                raise NotFound("webhook", webhook_id)
            hook.deleted_at = now
            pending = s.scalars(
                select(WebhookDelivery).where(
                    WebhookDelivery.webhook_id == webhook_id,
                    WebhookDelivery.status == DELIVERY_PENDING,
                )
            ).all()
            for d in pending:
                d.status, d.finished_at = DELIVERY_CANCELLED, now
                d.last_error = "webhook removed"
        logger.info(f"Webhook {webhook_id} of tenant {tenant_name} removed")
        return len(pending)

    def deliveries(self, tenant_name: str, limit: int = 20) -> list[WebhookDelivery]:
        """A tenant's delivery log, newest first."""
        with self._read() as s:
            tenant_id = self._tenant_id(s, tenant_name)
            return list(
                s.scalars(
                    select(WebhookDelivery)
                    .where(WebhookDelivery.tenant_id == tenant_id)
                    .order_by(WebhookDelivery.id.desc())
                    .limit(limit)
                )
            )

    def delivery_attempts(self, delivery_id: int) -> list[WebhookAttempt]:
        with self._read() as s:
            return list(
                s.scalars(
                    select(WebhookAttempt)
                    .where(WebhookAttempt.delivery_id == delivery_id)
                    .order_by(WebhookAttempt.number)
                )
            )

    @staticmethod
    def _tenant_id(s: Session, name: str) -> str:
        tenant = s.scalar(select(Tenant.id).where(Tenant.name == name))
        if tenant is None:
            raise NotFound("tenant", name)
        return tenant

    # -- the dispatcher's ------------------------------------------------------------
    def claim_delivery(
        self, lease_s: float, now: float | None = None
    ) -> Claimed | None:
        """The oldest due pending delivery, leased for ``lease_s`` (no other thread
        or process takes it meanwhile; after a crash it is due again once the
        lease ends). None when nothing is due."""
        now = time.time() if now is None else now
        with self._write() as s:
            row = s.execute(
                select(WebhookDelivery, Webhook.url, Webhook.secret)
                .join(Webhook, Webhook.id == WebhookDelivery.webhook_id)
                .where(
                    WebhookDelivery.status == DELIVERY_PENDING,
                    WebhookDelivery.next_attempt_at <= now,
                )
                .order_by(WebhookDelivery.next_attempt_at, WebhookDelivery.id)
                .limit(1)
                # PostgreSQL: concurrent dispatchers skip each other's rows.
                .with_for_update(skip_locked=True, of=WebhookDelivery)
            ).first()
            if row is None:
                return None
            d, url, secret = row
            d.next_attempt_at = now + lease_s
            return Claimed(d.id, d.message_id, url, secret, d.payload, d.attempts)

    def record_attempt(
        self,
        delivery_id: int,
        *,
        started_at: float,
        duration_s: float,
        status_code: int | None,
        error: str | None,
        delivered: bool,
        retry_at: float | None,
    ) -> WebhookDelivery:
        """Log one attempt; the delivery is done when ``delivered``, else pending
        again at ``retry_at`` (None: out of attempts, failed). A delivery that
        stopped being pending meanwhile (webhook removed) keeps its status."""
        now = started_at + duration_s
        with self._write() as s:
            d = s.get(WebhookDelivery, delivery_id)
            if d is None:
                raise NotFound("webhook delivery", str(delivery_id))
            d.attempts += 1
            s.add(
                WebhookAttempt(
                    delivery_id=delivery_id,
                    number=d.attempts,
                    started_at=started_at,
                    duration_s=duration_s,
                    status_code=status_code,
                    error=error,
                )
            )
            d.last_attempt_at = started_at
            d.last_status_code = status_code
            d.last_error = error
            if d.status != DELIVERY_PENDING:
                return d
            if delivered:
                d.status, d.finished_at = DELIVERY_DELIVERED, now
            elif retry_at is None:
                d.status, d.finished_at = DELIVERY_FAILED, now
            else:
                d.next_attempt_at = retry_at
        return d
