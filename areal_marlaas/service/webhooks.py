"""Webhook delivery: signed POSTs of the job store's outbox, on threads of their
own so that no receiver (down, slow or hanging) ever delays a job.

Each attempt is signed per Standard Webhooks, as OpenAI signs its own (the
``openai`` SDK's ``client.webhooks.unwrap(body, headers, secret=...)`` accepts
them)::

    webhook-id:        msg_...  (the same on every attempt of one delivery)
    webhook-timestamp: Unix seconds of this attempt
    webhook-signature: v1,<base64 HMAC-SHA256("{id}.{timestamp}.{body}")>

keyed by the base64-decoded ``whsec_`` secret. Any 2xx is delivered; anything
else (another status, a refused connection, a timeout) is retried after
``webhook_backoff_s x 2^(n-1)`` until ``webhook_max_attempts``. A delivery is
leased while its attempt runs, so after a crash or a restart it is simply due
again: delivery is at least once, and receivers dedupe by ``webhook-id``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import threading
import time

import httpx
from areal.utils import logging

from areal_marlaas.config.service import ServiceConfig
from areal_marlaas.service.store import Claimed, WebhookStore
from areal_marlaas.service.store.webhooks import SECRET_PREFIX

logger = logging.getLogger("MARLaaSWebhooks")

# Beyond the POST's own timeout, how long a claimed delivery stays leased (the
# attempt's record and DB writes): another thread must not take it meanwhile.
LEASE_MARGIN_S = 30.0
ERROR_CHARS = 500  # of an error or a reply body kept in the log


def sign(secret: str, message_id: str, timestamp: int, body: str) -> str:
    """The ``webhook-signature`` header value for one attempt."""
    if secret.startswith(SECRET_PREFIX):
        key = base64.b64decode(secret[len(SECRET_PREFIX) :])
    else:
        key = secret.encode()
    signed = f"{message_id}.{timestamp}.{body}".encode()
    digest = hmac.new(key, signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def headers_for(claimed: Claimed, timestamp: int) -> dict[str, str]:
    return {
        "content-type": "application/json",
        "user-agent": "marlaas-webhooks/1",
        "webhook-id": claimed.message_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(
            claimed.secret, claimed.message_id, timestamp, claimed.payload
        ),
    }


def backoff_s(cfg: ServiceConfig, attempts: int) -> float:
    """The wait after the ``attempts``-th failed attempt (1-based)."""
    return cfg.webhook_backoff_s * 2 ** (attempts - 1)


class WebhookDispatcher:
    """``cfg.webhook_workers`` daemon threads that take due deliveries from
    ``store`` and POST them; ``start()`` / ``stop()`` from the service runner."""

    def __init__(
        self,
        store: WebhookStore,
        cfg: ServiceConfig,
        *,
        poll_s: float | None = None,
    ):
        self.store = store
        self.cfg = cfg
        # New events wait at most this long (the runner's own poll by default).
        self.poll_s = cfg.poll_interval_s if poll_s is None else poll_s
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        self._stop.clear()
        for i in range(self.cfg.webhook_workers):
            t = threading.Thread(
                target=self._work, name=f"marlaas-webhooks-{i}", daemon=True
            )
            t.start()
            self._threads.append(t)
        logger.info(f"Webhook dispatcher started ({len(self._threads)} thread(s))")

    def stop(self, timeout: float | None = None) -> None:
        """Stop taking deliveries; an attempt in flight ends by its own timeout
        (daemon threads: a process exit does not wait for them). What is left
        pending is sent by the next start."""
        self._stop.set()
        wait = self.cfg.webhook_timeout_s + 1 if timeout is None else timeout
        deadline = time.monotonic() + wait
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        self._threads = [t for t in self._threads if t.is_alive()]

    def _work(self) -> None:
        with httpx.Client(
            timeout=self.cfg.webhook_timeout_s,
            follow_redirects=False,  # a redirect is the receiver's misconfiguration
            trust_env=False,  # no proxy from the environment sees signed events
        ) as client:
            while not self._stop.is_set():
                try:
                    claimed = self.store.claim_delivery(
                        self.cfg.webhook_timeout_s + LEASE_MARGIN_S
                    )
                except Exception:  # the DB is busy or gone: try again later
                    logger.exception("Could not read webhook deliveries")
                    claimed = None
                if claimed is None:
                    self._stop.wait(self.poll_s)
                    continue
                try:
                    self.attempt(client, claimed)
                except Exception:  # never let one delivery stop the thread
                    logger.exception(f"Webhook delivery {claimed.id} failed")

    def attempt(self, client: httpx.Client, claimed: Claimed) -> bool:
        """One signed POST of ``claimed`` and its record; True when delivered."""
        started = time.time()
        code, error = None, None
        try:
            r = client.post(
                claimed.url,
                content=claimed.payload.encode(),
                headers=headers_for(claimed, int(started)),
            )
            code = r.status_code
            if not r.is_success:
                reply = r.text.strip()[:ERROR_CHARS]
                error = f"HTTP {code}" + (f": {reply}" if reply else "")
        except httpx.HTTPError as e:
            error = f"{type(e).__name__}: {e}"[:ERROR_CHARS]
        done = error is None
        number = claimed.attempts + 1
        retry_at = None
        if not done and number < self.cfg.webhook_max_attempts:
            retry_at = time.time() + backoff_s(self.cfg, number)
        self.store.record_attempt(
            claimed.id,
            started_at=started,
            duration_s=time.time() - started,
            status_code=code,
            error=error,
            delivered=done,
            retry_at=retry_at,
        )
        if not done:
            then = "giving up" if retry_at is None else "will retry"
            logger.warning(
                f"Webhook {claimed.message_id} to {claimed.url}, attempt {number}: "
                f"{error}; {then}"
            )
        return done
