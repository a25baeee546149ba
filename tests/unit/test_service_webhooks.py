"""Webhooks over real HTTP: a receiver thread on 127.0.0.1, the SQLite store, the
dispatcher's threads, and every delivery checked by the official openai SDK."""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import pairwise
from types import SimpleNamespace

import openai
import pytest
from openai.types.webhooks import (
    FineTuningJobCancelledWebhookEvent,
    FineTuningJobFailedWebhookEvent,
    FineTuningJobSucceededWebhookEvent,
)

from areal_marlaas.config.service import ServiceConfig
from areal_marlaas.errors import ConfigError
from areal_marlaas.service.cli import main
from areal_marlaas.service.store import JobStore
from areal_marlaas.service.store import progress as progress_module
from areal_marlaas.service.store.webhooks import check_secret, check_url, new_secret
from areal_marlaas.service.tables import Job
from areal_marlaas.service.webhooks import WebhookDispatcher
from tests.support.jobs import new_tenant, running_job

SDK = openai.OpenAI(api_key="x", base_url="http://127.0.0.1:9/v1")
EVENT_CLASSES = {
    "succeeded": FineTuningJobSucceededWebhookEvent,
    "failed": FineTuningJobFailedWebhookEvent,
    "cancelled": FineTuningJobCancelledWebhookEvent,
}


@dataclass
class Received:
    body: bytes
    headers: dict[str, str]
    at: float


@dataclass
class Receiver:
    """An HTTP server answering POSTs by ``plan`` (one entry per request, in
    arrival order: a status code, or ``("block", event)``: a 200 once the event
    is set); 200 once the plan is used up."""

    plan: list = field(default_factory=list)
    got: list[Received] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["content-length"]))
                with receiver.lock:
                    receiver.got.append(
                        Received(body, dict(self.headers.items()), time.time())
                    )
                    step = receiver.plan.pop(0) if receiver.plan else 200
                if isinstance(step, tuple):
                    step[1].wait(60)
                    step = 200
                try:
                    self.send_response(step)
                    self.send_header("content-length", "2")
                    self.end_headers()
                    self.wfile.write(b"ok")
                except OSError:  # the client gave up (timeout)
                    pass

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.block_on_close = False
        threading.Thread(
            target=self.server.serve_forever, args=(0.05,), daemon=True
        ).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver().start()
    yield r
    r.stop()


@pytest.fixture
def store(tmp_path) -> Iterator[JobStore]:
    st = JobStore(f"sqlite:///{tmp_path / 'service.db'}", tmp_path)
    yield st
    st.close()


def config(tmp_path, **kw) -> ServiceConfig:
    base = dict(
        root=str(tmp_path),
        webhook_timeout_s=5.0,  # a local receiver answers in ms
        webhook_backoff_s=0.2,
        webhook_max_attempts=4,
        webhook_workers=2,
    )
    return ServiceConfig(**{**base, **kw})


@pytest.fixture
def dispatch(store, tmp_path) -> Iterator[Callable[..., WebhookDispatcher]]:
    started: list[WebhookDispatcher] = []

    def start(**kw) -> WebhookDispatcher:
        d = WebhookDispatcher(store, config(tmp_path, **kw), poll_s=0.05)
        d.start()
        started.append(d)
        return d

    yield start
    for d in started:
        d.stop(timeout=5)


def tenant_id_of(store: JobStore, name: str) -> str:
    return next(t.id for t in store.list_tenants() if t.name == name)


def finish(store: JobStore, job_id: str, status: str) -> Job:
    if status == "failed":
        return store.fail_job(job_id, "training_failed", "boom")
    return store.set_status(job_id, status)


def wait_for(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(0.02)


def unwrap(r: Received, secret: str):
    return SDK.webhooks.unwrap(r.body, r.headers, secret=secret)


# -- events: the outbox ------------------------------------------------------------


def test_a_terminal_status_enqueues_one_event_per_webhook_of_the_tenant(store):
    acme, other = new_tenant(store, "acme"), new_tenant(store, "other")
    store.add_webhook("acme", "http://127.0.0.1:1/a")
    store.add_webhook("acme", "https://hooks.example.com/b")
    store.add_webhook("other", "http://127.0.0.1:1/c")
    job = running_job(store, acme)
    running_job(store, other)
    assert store.deliveries("acme") == []  # only terminal statuses are events
    finish(store, job.id, "succeeded")
    store.set_status(job.id, "succeeded")  # the same status again: no event
    rows = store.deliveries("acme")
    assert len(rows) == 2 and {d.status for d in rows} == {"pending"}
    assert len({d.event_id for d in rows}) == 1  # one event, two messages
    assert len({d.message_id for d in rows}) == 2
    body = json.loads(rows[0].payload)
    assert body == {
        "id": rows[0].event_id,
        "object": "event",
        "type": "fine_tuning.job.succeeded",
        "created_at": int(store.job(job.id).finished_at or 0),
        "data": {"id": job.id},
    }
    assert body["id"].startswith("evt_")
    assert store.deliveries("other") == []  # another tenant's job: not theirs


def test_the_event_commits_in_the_status_change_transaction(store, monkeypatch):
    acme = new_tenant(store, "acme")
    store.add_webhook("acme", "http://127.0.0.1:1/a")
    job = running_job(store, acme)
    real = progress_module.enqueue_job_event

    def enqueue_then_crash(s, job, status, now):
        real(s, job, status, now)
        raise RuntimeError("crash after the outbox insert")

    monkeypatch.setattr(progress_module, "enqueue_job_event", enqueue_then_crash)
    with pytest.raises(RuntimeError):
        store.set_status(job.id, "cancelled")
    # Neither committed: the status stays, no event is left behind.
    assert store.job(job.id).status == "running" and store.deliveries("acme") == []
    monkeypatch.setattr(progress_module, "enqueue_job_event", real)
    store.set_status(job.id, "cancelled")
    assert [d.event_type for d in store.deliveries("acme")] == [
        "fine_tuning.job.cancelled"
    ]


# -- delivery ----------------------------------------------------------------------


def test_every_delivery_is_verified_by_the_openai_sdk(store, receiver, dispatch):
    acme = new_tenant(store, "acme")
    hook = store.add_webhook("acme", receiver.url)
    jobs = {s: running_job(store, acme).id for s in EVENT_CLASSES}
    dispatch()
    for status, job_id in jobs.items():
        finish(store, job_id, status)
    wait_for(lambda: len(receiver.got) == 3)
    seen = {}
    for r in receiver.got:
        event = unwrap(r, hook.secret)
        seen[event.data.id] = event
        assert r.headers["webhook-signature"].startswith("v1,")
    for status, job_id in jobs.items():
        event = seen[job_id]
        assert isinstance(event, EVENT_CLASSES[status])
        assert event.type == f"fine_tuning.job.{status}" and event.object == "event"
    wait_for(lambda: {d.status for d in store.deliveries("acme")} == {"delivered"})
    for d in store.deliveries("acme"):
        assert d.attempts == 1 and d.last_status_code == 200 and d.last_error is None
    r = receiver.got[0]
    tampered = r.body.replace(b'"event"', b'"evil!"')
    assert tampered != r.body
    with pytest.raises(openai.InvalidWebhookSignatureError):
        unwrap(Received(tampered, r.headers, r.at), hook.secret)
    with pytest.raises(openai.InvalidWebhookSignatureError):
        unwrap(r, new_secret())


def test_a_503_twice_is_delivered_on_the_third_attempt(store, receiver, dispatch):
    acme = new_tenant(store, "acme")
    hook = store.add_webhook("acme", receiver.url)
    receiver.plan = [503, 503]
    job = running_job(store, acme)
    dispatch()
    finish(store, job.id, "succeeded")
    wait_for(lambda: store.deliveries("acme")[0].status == "delivered")
    (d,) = store.deliveries("acme")
    assert d.attempts == 3 and d.last_status_code == 200
    attempts = store.delivery_attempts(d.id)
    assert [a.status_code for a in attempts] == [503, 503, 200]
    assert attempts[0].error == "HTTP 503: ok" and attempts[2].error is None
    # Exponential backoff: 0.2 s, then 0.4 s.
    gaps = [b.started_at - a.started_at for a, b in pairwise(attempts)]
    assert gaps[0] >= 0.2 and gaps[1] >= 0.4, gaps
    assert len(receiver.got) == 3
    assert len({r.headers["webhook-id"] for r in receiver.got}) == 1  # dedupe key
    for r in receiver.got:
        assert unwrap(r, hook.secret).data.id == job.id


def test_a_receiver_that_is_down_gets_max_attempts_then_failed(store, dispatch):
    acme = new_tenant(store, "acme")
    store.add_webhook("acme", f"http://127.0.0.1:{free_port()}/down")
    job = running_job(store, acme)
    dispatch(webhook_max_attempts=3, webhook_backoff_s=0.05)
    finish(store, job.id, "failed")
    wait_for(lambda: store.deliveries("acme")[0].status == "failed")
    time.sleep(0.3)  # nothing more is tried
    (d,) = store.deliveries("acme")
    assert d.attempts == 3 and d.last_status_code is None
    assert "ConnectError" in (d.last_error or "")
    assert len(store.delivery_attempts(d.id)) == 3


def test_a_hanging_receiver_never_delays_a_job(store, receiver, dispatch):
    acme = new_tenant(store, "acme")
    hook = store.add_webhook("acme", receiver.url)
    release = threading.Event()
    receiver.plan = [("block", release)]  # the first request hangs until released
    first, second = running_job(store, acme), running_job(store, acme)
    dispatch(webhook_timeout_s=2.0)
    try:
        finish(store, first.id, "succeeded")
        wait_for(lambda: len(receiver.got) == 1)  # the dispatcher is stuck in it
        finish(store, second.id, "cancelled")
        # Both status writes returned while the first attempt hung: had either
        # waited on the delivery, the attempt would have ended (cut at 2 s) first.
        hanging = next(d for d in store.deliveries("acme") if d.job_id == first.id)
        assert store.delivery_attempts(hanging.id) == []
        assert not release.is_set()
        # The attempt is cut at the timeout and retried, with the receiver
        # still hanging: the retry is its second request.
        wait_for(lambda: {d.status for d in store.deliveries("acme")} == {"delivered"})
    finally:
        release.set()
    by_job = {d.job_id: d for d in store.deliveries("acme")}
    assert by_job[second.id].attempts == 1
    hung = by_job[first.id]
    assert hung.attempts == 2 and hung.last_status_code == 200
    first_try = store.delivery_attempts(hung.id)[0]
    assert first_try.status_code is None and "Timeout" in (first_try.error or "")
    # Cut at this webhook_timeout_s (2 s), not at the default 5 s; never cut, the
    # retry and the delivery would not have come. Overshoot: ~0.01 s here.
    assert first_try.duration_s >= 2.0
    assert first_try.duration_s - 2.0 < 2.5
    for r in receiver.got:
        unwrap(r, hook.secret)


def test_pending_deliveries_resume_after_a_restart(tmp_path, receiver):
    url = f"sqlite:///{tmp_path / 'service.db'}"
    store = JobStore(url, tmp_path)
    acme = new_tenant(store, "acme")
    hook = store.add_webhook("acme", receiver.url)
    jobs = [running_job(store, acme) for _ in range(2)]
    finish(store, jobs[0].id, "succeeded")  # no dispatcher runs: it stays pending
    finish(store, jobs[1].id, "failed")
    # A dispatcher that died in the middle of an attempt: its lease runs out.
    assert store.claim_delivery(lease_s=0.5) is not None
    store.close()
    store = JobStore(url, tmp_path)  # the restarted service
    dispatcher = WebhookDispatcher(store, config(tmp_path), poll_s=0.05)
    dispatcher.start()
    try:
        wait_for(lambda: {d.status for d in store.deliveries("acme")} == {"delivered"})
    finally:
        dispatcher.stop(timeout=5)
    assert sorted(unwrap(r, hook.secret).data.id for r in receiver.got) == sorted(
        j.id for j in jobs
    )
    assert [d.attempts for d in store.deliveries("acme")] == [1, 1]
    store.close()


def test_a_claimed_delivery_is_leased_until_its_attempt_is_recorded(
    db_url,  # noqa: F811
    tmp_path,
):
    store = JobStore(db_url, tmp_path)
    acme = new_tenant(store, "acme")
    store.add_webhook("acme", "http://127.0.0.1:1/x")
    job = running_job(store, acme)
    finish(store, job.id, "succeeded")
    now = time.time() + 1
    claimed = store.claim_delivery(60, now=now)
    assert claimed is not None and claimed.attempts == 0
    assert claimed.url == "http://127.0.0.1:1/x"
    assert store.claim_delivery(60, now=now + 59) is None  # leased
    record = dict(started_at=now, duration_s=0.1, status_code=500, error="HTTP 500")
    store.record_attempt(claimed.id, **record, delivered=False, retry_at=now + 5)
    assert store.claim_delivery(60, now=now + 4) is None  # backing off
    again = store.claim_delivery(60, now=now + 5)
    assert again is not None and (again.id, again.attempts) == (claimed.id, 1)
    store.record_attempt(again.id, **record, delivered=True, retry_at=None)
    assert store.claim_delivery(60, now=now + 10**6) is None
    (d,) = store.deliveries("acme")
    assert d.status == "delivered" and d.attempts == 2
    store.close()


def test_the_service_runner_runs_the_dispatcher(store, tmp_path, receiver):
    from areal_marlaas.service.runner import ServiceRunner

    acme = new_tenant(store, "acme")
    store.add_webhook("acme", receiver.url)
    finish(store, running_job(store, acme).id, "succeeded")  # left by a last run

    class Stack:
        def start_trainer(self):
            # The dispatcher already runs: the pending event goes out now.
            wait_for(lambda: store.deliveries("acme")[0].status == "delivered")
            raise RuntimeError("no trainer in this test")

        def close(self):
            pass

    runner = SimpleNamespace(
        cfg=None,
        stack=Stack(),
        jobs=store,
        svc=config(tmp_path, poll_interval_s=0.05),
        stop=threading.Event(),
        api=None,
    )
    with pytest.raises(RuntimeError, match="no trainer"):
        ServiceRunner.run(runner)  # type: ignore[arg-type]
    names = [t.name for t in threading.enumerate()]
    assert not [n for n in names if n.startswith("marlaas-webhooks")], names


# -- the operator's commands -------------------------------------------------------


def run(capsys, *argv) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_webhook_commands(tmp_path, capsys, receiver):
    root = f"service.root={tmp_path}"
    for name in ("acme", "other"):
        assert run(capsys, "tenant", "add", name, root)[0] == 0
    rc, out, err = run(
        capsys, "tenant", "webhook", "add", "acme", "--url", receiver.url, root
    )
    hook_id, secret = out.split()
    assert rc == 0 and hook_id.startswith("wh_") and "shown only now" in err
    assert secret.startswith("whsec_") and len(base64.b64decode(secret[6:])) >= 24
    given = new_secret()
    rc, out, err = run(
        capsys,
        "tenant",
        "webhook",
        "add",
        "other",
        "--url",
        "https://hooks.example.com/x",
        "--secret",
        given,
        root,
    )
    other_id = out.strip()
    assert rc == 0 and other_id.startswith("wh_") and given not in out + err
    rc, out, _ = run(capsys, "tenant", "webhook", "list", "acme", root)
    assert rc == 0 and out.split("\t")[:2] == [hook_id, receiver.url]
    assert secret not in out and other_id not in out  # a tenant sees its own only
    rc, out, _ = run(capsys, "tenant", "webhook", "list", "other", root)
    assert other_id in out and hook_id not in out

    rc, _, err = run(capsys, "tenant", "webhook", "add", "acme", "--url", "x.io", root)
    assert rc == 1 and "--url" in err and "https://" in err, err
    short = "whsec_" + base64.b64encode(b"x" * 8).decode()
    args = ("tenant", "webhook", "add", "acme", "--url", receiver.url, "--secret")
    rc, _, err = run(capsys, *args, short, root)
    assert rc == 1 and "--secret" in err and "24..64 bytes" in err, err

    store = JobStore(f"sqlite:///{tmp_path / 'service.db'}", tmp_path)
    job = running_job(store, tenant_id_of(store, "acme"))
    store.set_status(job.id, "succeeded")
    dispatcher = WebhookDispatcher(store, config(tmp_path), poll_s=0.05)
    dispatcher.start()
    wait_for(lambda: store.deliveries("acme")[0].status == "delivered")
    dispatcher.stop(timeout=5)
    assert unwrap(receiver.got[0], secret).data.id == job.id
    rc, out, _ = run(capsys, "tenant", "webhook", "deliveries", "acme", root)
    header, row = out.strip().splitlines()
    assert rc == 0 and header.split()[:3] == ["created", "event", "job"]
    assert "fine_tuning.job.succeeded" in row and job.id in row
    assert "delivered" in row and "HTTP 200" in row
    rc, out, _ = run(capsys, "tenant", "webhook", "deliveries", "other", root)
    assert rc == 0 and job.id not in out and len(out.strip().splitlines()) == 1

    # Removing: only through its own tenant; pending deliveries are cancelled.
    rc, _, err = run(capsys, "tenant", "webhook", "remove", "other", hook_id, root)
    assert rc == 1 and "No such webhook" in err
    second = running_job(store, tenant_id_of(store, "acme"))
    store.set_status(second.id, "cancelled")
    rc, _, err = run(capsys, "tenant", "webhook", "remove", "acme", hook_id, root)
    assert rc == 0 and "1 pending delivery(ies) cancelled" in err
    rc, out, _ = run(capsys, "tenant", "webhook", "list", "acme", root)
    assert rc == 0 and out == ""
    assert store.deliveries("acme")[0].status == "cancelled"
    store.close()


@pytest.mark.parametrize(
    "url", ["ftp://x/y", "hooks.example.com", "http:///nohost", "", "javascript:x"]
)
def test_urls_other_than_http_with_a_host_are_refused(url):
    with pytest.raises(ValueError, match="--url .* e.g. --url https://"):
        check_url(url)


@pytest.mark.parametrize(
    "secret", ["secret", "whsec_!!!", "whsec_", "whsec_" + "A" * 200, "sk-abc"]
)
def test_bad_secrets_are_refused(secret):
    with pytest.raises(ValueError, match="--secret"):
        check_secret(secret)
    check_secret(new_secret())


def test_webhook_settings_are_checked():
    for key in ("webhook_timeout_s", "webhook_backoff_s"):
        with pytest.raises(ConfigError, match=f"service.{key}"):
            ServiceConfig(**{key: 0})
    for key in ("webhook_max_attempts", "webhook_workers"):
        with pytest.raises(ConfigError, match=f"service.{key}"):
            ServiceConfig(**{key: 0})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
