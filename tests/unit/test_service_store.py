"""The job store on a real SQLite file: migrations, schema drift, SQLite settings,
and the scheduler-side writer functions the integrator calls."""

from __future__ import annotations

import hashlib
import sqlite3
import threading

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect, select
from sqlalchemy.exc import IntegrityError

from areal_marlaas.service.db import (
    alembic_config,
    current_revision,
    make_engine,
    upgrade_to_head,
)
from areal_marlaas.service.store import (
    ApiJobStore,
    FileStore,
    InvalidAction,
    InvalidTransition,
    JobStore,
    LimitExceeded,
    NewJob,
    NotFound,
    ProgressStore,
    TenantStore,
    effective_status,
)
from areal_marlaas.service.tables import ApiKey, Base, Event

BODY = b'{"messages": [{"role": "user", "content": "1 + 1?"}], "answer": "2"}\n' * 4
TABLES = {
    "tenants",
    "api_keys",
    "files",
    "jobs",
    "job_actions",
    "events",
    "checkpoints",
    "webhooks",
    "webhook_deliveries",
    "webhook_attempts",
    "evals",
    "eval_runs",
    "eval_output_items",
    "alembic_version",
}


def head_revision() -> str:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


@pytest.fixture
def store(db_url, tmp_path):
    st = JobStore(db_url, tmp_path)
    yield st
    st.close()


def new_job(file_id: str, **kw) -> NewJob:
    base = dict(
        model="base",
        training_file=file_id,
        validation_file=None,
        method={"type": "reinforcement"},
        hyperparameters={"batch_size": 2},
        metadata=None,
        seed=0,
        suffix=None,
        steps_total=3,
        request_sha256="h",
    )
    return NewJob(**{**base, **kw})


def tenant_with_file(store: JobStore, name: str) -> tuple[str, str]:
    tenant, _ = store.create_tenant(name)
    f = store.add_file(tenant.id, "t.jsonl", "fine-tune", BODY, 4)
    return tenant.id, f.id


# -- schema --------------------------------------------------------------------------


def test_migrations_build_the_schema_on_an_empty_sqlite_file(tmp_path):
    db = tmp_path / "sub" / "empty.db"
    url = f"sqlite:///{db}"
    upgrade_to_head(url)
    engine = create_engine(url)
    assert set(inspect(engine).get_table_names()) == TABLES
    assert current_revision(engine) == head_revision()
    upgrade_to_head(url)  # at head already: nothing to do, nothing breaks
    assert current_revision(engine) == head_revision()
    engine.dispose()


def test_models_and_migrations_do_not_drift(db_url):
    engine = make_engine(db_url)
    upgrade_to_head(engine)
    with engine.connect() as conn:
        assert set(inspect(conn).get_table_names()) == TABLES
        ctx = MigrationContext.configure(conn, opts={"compare_type": True})
        diff = compare_metadata(ctx, Base.metadata)
    assert diff == [], diff
    engine.dispose()


def test_sqlite_runs_in_wal_mode_with_foreign_keys(tmp_path):
    store = JobStore(f"sqlite:///{tmp_path / 'service.db'}", tmp_path)
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    with pytest.raises(IntegrityError), store._write() as s:
        s.add(
            Event(
                job_id="ftjob-none",
                created_at=0,
                level="info",
                message="x",
                type="message",
            )
        )
    raw = sqlite3.connect(tmp_path / "service.db")
    assert raw.execute("PRAGMA journal_mode").fetchone() == ("wal",)  # persistent
    raw.close()
    store.close()


# -- tenants and keys ----------------------------------------------------------------


PROGRESS_WRITERS = {
    "set_status",
    "fail_job",
    "record_step",
    "record_checkpoint",
    "set_plan",
    "add_event",
    "mark_action_handled",
    "add_result_file",
}


def test_only_the_scheduler_part_of_the_store_writes_progress():
    assert set(dir(ProgressStore)) >= PROGRESS_WRITERS
    for part in (TenantStore, FileStore, ApiJobStore):
        assert not PROGRESS_WRITERS & set(dir(part)), part.__name__
    assert issubclass(JobStore, (TenantStore, ApiJobStore, ProgressStore))


def test_keys_are_stored_hashed_and_can_be_revoked(store):
    tenant, key = store.create_tenant("acme")
    assert key.startswith("sk-marlaas-") and len(key) > 50
    assert store.authenticate(key).id == tenant.id
    assert store.authenticate(key + "x") is None and store.authenticate("") is None
    with store._read() as s:
        (row,) = s.scalars(select(ApiKey)).all()
    assert row.key_hash == hashlib.sha256(key.encode()).hexdigest()
    assert key not in repr([row.key_hash, row.prefix])  # only the hash is stored
    second = store.issue_key("acme")
    assert store.revoke("acme", second[:15]) == 1
    assert store.authenticate(second) is None and store.authenticate(key) is not None
    assert store.revoke("acme") == 1
    assert store.authenticate(key) is None
    (info,) = store.list_tenants()
    assert info.disabled and info.active_keys == []
    with pytest.raises(ValueError, match="tenant name"):
        store.create_tenant("Bad Name")
    with pytest.raises(Exception, match="already exists"):
        store.create_tenant("acme")


# -- the scheduler side ----------------------------------------------------------------


def test_status_transitions_are_checked(store):
    a, fa = tenant_with_file(store, "a")
    job, _ = store.create_job(a, new_job(fa))
    with pytest.raises(InvalidTransition, match="validating_files to running"):
        store.set_status(job.id, "running")
    with pytest.raises(InvalidTransition, match="unknown job status"):
        store.set_status(job.id, "exploded")
    store.set_status(job.id, "queued")
    assert store.set_status(job.id, "queued").status == "queued"  # no-op
    failed = store.fail_job(
        job.id, "invalid_training_file", "line 2: no answer", "training_file"
    )
    assert failed.error == {
        "code": "invalid_training_file",
        "message": "line 2: no answer",
        "param": "training_file",
    }
    assert failed.finished_at is not None
    for status in ("queued", "running", "cancelled"):
        with pytest.raises(InvalidTransition):
            store.set_status(job.id, status)
    with pytest.raises(InvalidTransition):
        store.record_step(job.id, 1)
    with pytest.raises(InvalidAction, match="already failed"):
        store.request_action(a, job.id, "cancel")
    levels = [e.level for e in store.list_events(a, job.id).items]
    assert levels[0] == "error"


def test_steps_ttfs_checkpoints_and_result_files(store):
    a, fa = tenant_with_file(store, "acme")
    job, _ = store.create_job(a, new_job(fa, suffix="v1"))
    store.set_status(job.id, "queued")
    store.set_status(job.id, "running")
    t1 = job.created_at + 42.0
    store.record_step(
        job.id, 1, {"reward": 0.25, "loss": float("nan")}, trained_tokens=64, at=t1
    )
    store.record_step(job.id, 2, {"reward": 0.5}, trained_tokens=128, at=t1 + 10)
    j = store.job(job.id)
    assert (j.steps_done, j.trained_tokens, j.first_step_at) == (2, 128, t1)
    assert j.ttfs_s == pytest.approx(42.0)
    (metrics, older) = [
        e for e in store.list_events(a, job.id).items if e.type == "metrics"
    ]
    assert metrics.data == {"step": 2, "total_steps": 3, "reward": 0.5}
    assert older.data["loss"] is None  # NaN is not JSON
    adapter = store.root / "adapters" / j.task_name / "v2"
    adapter.mkdir(parents=True)
    ckpt = store.record_checkpoint(job.id, 2, 2, adapter, {"reward": 0.5})
    ft = store.job(job.id).fine_tuned_model
    hexpart = job.id.removeprefix("ftjob-")
    assert ft == f"ft:base:acme:v1:{hexpart}"
    assert ckpt.fine_tuned_model_checkpoint == f"{ft}:ckpt-step-2"
    assert ckpt.adapter_path == f"adapters/{j.task_name}/v2"
    assert store.checkpoint_for_model(a, ft).id == ckpt.id
    assert store.checkpoint_for_model(a, ckpt.fine_tuned_model_checkpoint).id == ckpt.id
    with pytest.raises(ValueError, match="not under the service root"):
        store.record_checkpoint(job.id, 3, 3, "/etc")
    with pytest.raises(IntegrityError):
        store.record_checkpoint(job.id, 2, 2, adapter)  # one checkpoint per step
    f = store.add_result_file(job.id, "metrics.csv", b"step,reward\n1,0.25\n2,0.5\n")
    assert store.job(job.id).result_files == [f.id]
    assert store.get_file(a, f.id).purpose == "fine-tune-results"
    assert store.file_of_job(job.id).read_bytes() == BODY
    store.set_status(job.id, "succeeded")
    other, _ = tenant_with_file(store, "other")
    assert store.checkpoint_for_model(other, ft) is None
    assert store.checkpoint_for_model(other, ckpt.fine_tuned_model_checkpoint) is None
    with pytest.raises(NotFound):
        store.get_job(other, job.id)


def test_effective_status_applies_pending_requests_in_order():
    assert effective_status("running", ["pause"]) == "paused"
    assert effective_status("running", ["pause", "resume"]) == "queued"
    assert effective_status("paused", ["resume", "cancel"]) == "cancelled"
    assert effective_status("succeeded", ["cancel"]) == "succeeded"


def test_concurrent_creates_respect_the_limit_and_the_idempotency_key(store):
    a, fa = tenant_with_file(store, "a")
    results, errors = [], []

    def create(key):
        try:
            results.append(
                store.create_job(a, new_job(fa), idempotency_key=key, max_queued=3)
            )
        except Exception as e:  # all of them are checked below
            errors.append(e)

    threads = [threading.Thread(target=create, args=(None,)) for _ in range(6)]
    threads += [threading.Thread(target=create, args=("same",)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Only refusals: no "database is locked" from two writers upgrading locks.
    assert all(isinstance(e, LimitExceeded) for e in errors), errors
    created = [j for j, new in results if new]
    assert len(created) == 3  # never over max_queued_jobs
    assert len(store.list_jobs(a).items) == 3
    same = {j.id for j, _ in results if j.idempotency_key == "same"}
    assert len(same) <= 1  # one job per key, however the race went
