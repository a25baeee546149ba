"""The service API through the official ``openai`` SDK (only base_url and api_key
set) against a real uvicorn server and a real SQLite job store; raw ``httpx`` only
for requests the SDK cannot express."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from openai.types import FileObject
from openai.types.fine_tuning import FineTuningJob, FineTuningJobEvent
from openai.types.fine_tuning.jobs import FineTuningJobCheckpoint
from sqlalchemy import select

from areal_marlaas.service.auth import new_admin_key
from areal_marlaas.service.tables import JobAction
from tests.support.service_api import (
    BASE,
    GRADER,
    METHOD,
    create_job,
    jsonl,
    rows,
    service_fixture,
    snapshot,
    upload,
)

svc = service_fixture(
    max_file_bytes=64 * 1024,
    max_files=6,
    max_queued_jobs=4,
    max_running_jobs=1,
    max_request_bytes=256 * 1024,
)


def hp(**kw) -> dict:
    return {
        "type": "reinforcement",
        "reinforcement": {"grader": GRADER, "hyperparameters": kw},
    }


# -- files ---------------------------------------------------------------------------


def test_files_upload_list_retrieve_content_delete(svc):
    _, _, client = svc.tenant()
    body = jsonl(rows(5))
    f = client.files.create(file=("train.jsonl", body), purpose="fine-tune")
    assert isinstance(f, FileObject)
    FileObject.model_validate(f.model_dump())
    assert (f.purpose, f.bytes, f.filename, f.status) == (
        "fine-tune",
        len(body),
        "train.jsonl",
        "processed",
    )
    assert client.files.retrieve(f.id) == f
    assert [x.id for x in client.files.list()] == [f.id]
    assert client.files.content(f.id).content == body
    deleted = client.files.delete(f.id)
    assert deleted.deleted and deleted.id == f.id
    with pytest.raises(openai.NotFoundError, match="No such file"):
        client.files.retrieve(f.id)
    with pytest.raises(openai.NotFoundError):
        client.files.content(f.id)
    assert list(client.files.list()) == []


def test_files_list_pages_with_after_and_limit(svc):
    _, _, client = svc.tenant()
    ids = [upload(client, 1, f"f{i}.jsonl").id for i in range(4)]
    page = client.files.list(limit=3)
    assert [f.id for f in page.data] == ids[::-1][:3] and page.has_more
    assert [f.id for f in client.files.list(limit=3, after=page.data[-1].id)] == [
        ids[0]
    ]
    assert [f.id for f in client.files.list(limit=1)] == ids[::-1]
    assert [f.id for f in client.files.list(order="asc", limit=2)] == ids


@pytest.mark.parametrize(
    "body, needle",
    [
        (jsonl(rows(2)) + b'{"messages": [\n', "Line 3 is not valid JSON"),
        (
            jsonl(rows(1))
            + jsonl(
                [
                    {
                        "messages": [
                            {"role": "user", "content": "hi"},
                            {"role": "tool", "content": "x"},
                        ]
                    }
                ]
            ),
            "Line 2: the last message must be a user turn",
        ),
        (
            b'{"messages": [{"role": "user", "content": "caf\xe9"}]}\n',
            "not valid UTF-8: line 1",
        ),
        (b"[1, 2]\n", "Line 1 must be a JSON object"),
        (b'{"prompt": "x"}\n', "Line 1 needs 'messages'"),
        (b'{"messages": [{"role": "wizard", "content": "x"}]}\n', "role 'wizard'"),
        (b'{"messages": [{"role": "user"}]}\n', "needs 'content'"),
        (b"\n\n", "no examples"),
    ],
    ids=[
        "bad-json-line-3",
        "ends-with-a-tool-turn",
        "non-utf8",
        "not-object",
        "no-messages",
        "bad-role",
        "no-content",
        "empty",
    ],
)
def test_upload_validation_names_line_and_problem(svc, body, needle):
    _, _, client = svc.tenant()
    with pytest.raises(openai.BadRequestError) as e:
        client.files.create(file=("t.jsonl", body), purpose="fine-tune")
    assert needle in e.value.message
    assert e.value.body["param"] == "file"
    assert list(client.files.list()) == []


def test_oversized_upload_is_413_and_stores_nothing(svc):
    _, _, client = svc.tenant()
    big = jsonl([{"messages": [{"role": "user", "content": "x" * 1000}]}] * 70)
    assert svc.cfg.max_file_bytes < len(big) < svc.cfg.max_file_bytes + 64 * 1024
    with pytest.raises(openai.APIStatusError) as e:
        client.files.create(file=("big.jsonl", big), purpose="fine-tune")
    assert e.value.status_code == 413 and "max_file_bytes" in e.value.message
    # Far over the limit: refused from Content-Length, before the body is read.
    with pytest.raises(openai.APIStatusError) as e:
        client.files.create(file=("big.jsonl", big * 20), purpose="fine-tune")
    assert e.value.status_code == 413
    assert list(client.files.list()) == []


def test_chunked_upload_over_the_limit_is_413(svc):
    """No Content-Length: the body is counted while the route reads it."""
    tenant_id, key, client = svc.tenant()
    big = jsonl([{"messages": [{"role": "user", "content": "x" * 1000}]}] * 200)
    boundary = "marlaasboundary"
    body = (
        (
            f"--{boundary}\r\nContent-Disposition: form-data; "
            'name="purpose"\r\n\r\nfine-tune\r\n'
            f"--{boundary}\r\nContent-Disposition: form-data; "
            'name="file"; filename="big.jsonl"\r\n\r\n'
        ).encode()
        + big
        + f"\r\n--{boundary}--\r\n".encode()
    )

    def chunks():
        for i in range(0, len(body), 16384):
            yield body[i : i + 16384]

    r = httpx.post(
        f"{svc.api.base_url}/files",
        content=chunks(),
        headers={
            "Authorization": f"Bearer {key}",
            "Content-Type": f"multipart/form-data; boundary={boundary}",
        },
    )
    assert r.status_code == 413, r.text
    assert r.json()["error"]["code"] == "request_too_large"
    assert list(client.files.list()) == []
    assert not (svc.store.root / "files" / tenant_id).exists()


def test_path_like_filename_never_becomes_a_path(svc):
    tenant_id, _, client = svc.tenant()
    f = client.files.create(
        file=("../../../../tmp/evil.jsonl", jsonl(rows(1))), purpose="fine-tune"
    )
    assert f.filename == "evil.jsonl"
    stored = svc.store.get_file(tenant_id, f.id)
    assert stored.path == f"files/{tenant_id}/{f.id}.jsonl"
    assert (svc.store.root / stored.path).read_bytes() == jsonl(rows(1))
    f2 = client.files.create(
        file=("..\\..\\win.jsonl", jsonl(rows(1))), purpose="fine-tune"
    )
    assert f2.filename == "win.jsonl"


def test_upload_refuses_other_purposes(svc):
    _, _, client = svc.tenant()
    with pytest.raises(openai.BadRequestError) as e:
        client.files.create(file=("b.jsonl", jsonl(rows(1))), purpose="batch")
    assert e.value.body["param"] == "purpose"


# -- jobs ----------------------------------------------------------------------------


def test_create_job_returns_sdk_job_object(svc):
    tenant_id, _, client = svc.tenant()
    f = upload(client, 10)
    job = create_job(
        client,
        f.id,
        method=hp(
            batch_size=4, n_epochs=2, compute_multiplier=2, learning_rate_multiplier=0.5
        ),
        metadata={"team": "a"},
        seed=7,
        suffix="my-model",
    )
    FineTuningJob.model_validate(job.model_dump())
    assert job.object == "fine_tuning.job" and job.status == "validating_files"
    assert (job.model, job.training_file, job.organization_id) == (
        BASE,
        f.id,
        tenant_id,
    )
    assert (
        job.seed == 7 and job.metadata == {"team": "a"} and job.fine_tuned_model is None
    )
    assert job.method.type == "reinforcement"
    assert job.method.reinforcement.grader.type == "string_check"
    h = job.method.reinforcement.hyperparameters
    assert (
        h.batch_size,
        h.n_epochs,
        h.compute_multiplier,
        h.learning_rate_multiplier,
    ) == (4, 2, 2.0, 0.5)
    extra = job.model_dump()
    assert extra["steps_total"] == 5 and extra["steps_done"] == 0  # ceil(10*2/4)
    assert extra["hyperparameters"]["group_size"] == 8
    assert extra["hyperparameters"]["learning_rate"] == pytest.approx(
        0.5 * svc.cfg.base_learning_rate
    )
    assert client.fine_tuning.jobs.retrieve(job.id) == job
    row = svc.store.job(job.id)
    assert row.task_name == "job_" + job.id.removeprefix("ftjob-")


def test_auto_hyperparameters_take_service_defaults_and_cap_steps(svc):
    _, _, client = svc.tenant()
    f = upload(client, 30)
    job = create_job(client, f.id, method=hp(batch_size="auto", n_epochs=100))
    h = job.method.reinforcement.hyperparameters
    assert h.batch_size == svc.cfg.default_batch_size
    assert h.eval_interval == svc.cfg.default_eval_interval
    assert job.model_dump()["steps_total"] == svc.cfg.max_steps_per_job


def test_list_jobs_pages_newest_first_and_filters_metadata(svc):
    _, _, client = svc.tenant()
    f = upload(client)
    made = []
    for i in range(4):
        made.append(
            create_job(client, f.id, metadata={"i": str(i), "even": str(i % 2 == 0)}).id
        )
        svc.store.set_status(made[-1], "cancelled")  # keep under max_queued_jobs
    newest = made[::-1]
    page = client.fine_tuning.jobs.list(limit=3)
    assert [j.id for j in page.data] == newest[:3] and page.has_more
    nxt = client.fine_tuning.jobs.list(limit=3, after=page.data[-1].id)
    assert [j.id for j in nxt.data] == newest[3:] and not nxt.has_more
    assert [j.id for j in client.fine_tuning.jobs.list(limit=1)] == newest
    evens = client.fine_tuning.jobs.list(metadata={"even": "True"}, limit=1)
    assert [j.id for j in evens] == [made[2], made[0]]
    assert [
        j.id for j in client.fine_tuning.jobs.list(metadata={"i": "1", "even": "False"})
    ] == [made[1]]
    assert list(client.fine_tuning.jobs.list(metadata={"i": "9"})) == []
    # metadata=null: jobs created without metadata.
    plain = create_job(client, f.id)
    null = client.fine_tuning.jobs.list(extra_query={"metadata": "null"})
    assert [j.id for j in null] == [plain.id]


def test_idempotency_key_returns_the_same_job(svc):
    _, _, client = svc.tenant()
    f = upload(client)
    key = {"Idempotency-Key": "retry-1"}
    a = create_job(client, f.id, extra_headers=key)
    b = create_job(client, f.id, extra_headers=key)
    assert a.id == b.id
    assert [j.id for j in client.fine_tuning.jobs.list()] == [a.id]
    with pytest.raises(openai.ConflictError, match="different request body"):
        create_job(client, f.id, seed=3, extra_headers=key)
    # Keys are per tenant: another tenant's identical key is its own job.
    _, _, other = svc.tenant()
    g = upload(other)
    assert create_job(other, g.id, extra_headers=key).id != a.id
    assert len(list(client.fine_tuning.jobs.list())) == 1


def test_sdk_retry_without_key_returns_the_job_its_first_attempt_made(svc):
    """The SDK resends a create after a timeout with x-stainless-retry-count >= 1
    and no Idempotency-Key; the first attempt may have created the job."""
    _, key, client = svc.tenant()
    f = upload(client)
    body = {"model": BASE, "training_file": f.id, "method": METHOD}
    url, auth = (
        f"{svc.api.base_url}/fine_tuning/jobs",
        {"Authorization": f"Bearer {key}"},
    )
    first = httpx.post(url, json=body, headers={**auth, "x-stainless-retry-count": "0"})
    retry = httpx.post(url, json=body, headers={**auth, "x-stainless-retry-count": "1"})
    assert first.status_code == retry.status_code == 200
    assert retry.json()["id"] == first.json()["id"]
    # A deliberate second identical job (a first attempt) is a new job.
    again = httpx.post(url, json=body, headers={**auth, "x-stainless-retry-count": "0"})
    assert again.json()["id"] != first.json()["id"]
    assert len(list(client.fine_tuning.jobs.list())) == 2


def actions(svc, job_id: str) -> list[tuple[str, bool]]:
    with svc.store._read() as s:
        q = select(JobAction).where(JobAction.job_id == job_id).order_by(JobAction.id)
        return [(a.action, a.handled_at is not None) for a in s.scalars(q)]


def test_cancel_pause_resume_insert_actions_and_refuse_impossible_ones(svc):
    _, _, client = svc.tenant()
    f = upload(client)
    job = create_job(client, f.id)
    paused = client.fine_tuning.jobs.pause(job.id)
    assert paused.status == "validating_files"  # the scheduler applies it
    assert paused.model_dump()["pending_action"] == "pause"
    assert actions(svc, job.id) == [("pause", False)]
    with pytest.raises(openai.BadRequestError, match="already paused"):
        client.fine_tuning.jobs.pause(job.id)
    client.fine_tuning.jobs.resume(job.id)
    with pytest.raises(openai.BadRequestError, match="is not paused"):
        client.fine_tuning.jobs.resume(job.id)
    assert actions(svc, job.id) == [("pause", False), ("resume", False)]
    # The scheduler applies them.
    for a in svc.store.pending_actions():
        svc.store.mark_action_handled(a.id)
    client.fine_tuning.jobs.cancel(job.id)
    client.fine_tuning.jobs.cancel(job.id)  # already being cancelled: no second row
    with pytest.raises(openai.BadRequestError, match="being cancelled"):
        client.fine_tuning.jobs.pause(job.id)
    assert actions(svc, job.id) == [
        ("pause", True),
        ("resume", True),
        ("cancel", False),
    ]
    (cancel,) = [a for a in svc.store.pending_actions() if a.job_id == job.id]
    svc.store.set_status(job.id, "cancelled")
    svc.store.mark_action_handled(cancel.id)
    assert client.fine_tuning.jobs.retrieve(job.id).status == "cancelled"
    for verb in ("cancel", "pause", "resume"):
        with pytest.raises(openai.BadRequestError, match="already been cancelled"):
            getattr(client.fine_tuning.jobs, verb)(job.id)
    assert len(actions(svc, job.id)) == 3


def test_events_and_checkpoints_page_after_scheduler_writes(svc, tmp_path):
    tenant_id, _, client = svc.tenant()
    f = upload(client, 8)
    job = create_job(client, f.id, method=hp(batch_size=2))
    st = svc.store
    st.set_status(job.id, "queued")
    st.set_status(job.id, "running")
    ckpts = []
    for step in (1, 2, 3):
        st.record_step(job.id, step, {"reward": step / 10}, trained_tokens=100 * step)
        adapter = st.root / "adapters" / job.id / f"v{step}"
        adapter.mkdir(parents=True)
        ckpts.append(
            st.record_checkpoint(job.id, step, step, adapter, {"reward": step / 10})
        )
    st.set_status(job.id, "succeeded")

    done = client.fine_tuning.jobs.retrieve(job.id)
    assert (
        done.status == "succeeded" and done.trained_tokens == 300 and done.finished_at
    )
    assert (
        done.fine_tuned_model.startswith(f"ft:{BASE}:")
        and done.model_dump()["ttfs_s"] >= 0
    )
    events = list(client.fine_tuning.jobs.list_events(job.id, limit=2))
    for e in events:
        FineTuningJobEvent.model_validate(e.model_dump())
    ids = [int(e.id.removeprefix("ftevent-")) for e in events]
    assert ids == sorted(ids, reverse=True) and len(set(ids)) == len(ids)
    assert events[-1].message == f"Created fine-tuning job: {job.id}"
    assert events[0].message == "The job has successfully completed"
    metrics = [e for e in events if e.type == "metrics"]
    assert [e.data["step"] for e in metrics] == [3, 2, 1]
    page = client.fine_tuning.jobs.list_events(job.id, limit=3)
    rest = client.fine_tuning.jobs.list_events(
        job.id, after=page.data[-1].id, limit=100
    )
    assert [e.id for e in page.data + rest.data] == [e.id for e in events]

    cps = client.fine_tuning.jobs.checkpoints.list(job.id, limit=2)
    assert [c.step_number for c in cps.data] == [3, 2] and cps.has_more
    all_cps = list(cps)
    assert [c.id for c in all_cps] == [c.id for c in ckpts[::-1]]
    for c in all_cps:
        FineTuningJobCheckpoint.model_validate(c.model_dump())
        assert c.fine_tuning_job_id == job.id
        assert (
            c.fine_tuned_model_checkpoint
            == f"{done.fine_tuned_model}:ckpt-step-{c.step_number}"
        )
    models = {m.id for m in client.models.list()}
    assert models == {
        BASE,
        done.fine_tuned_model,
        *(c.fine_tuned_model_checkpoint for c in ckpts),
    }
    assert (
        client.models.retrieve(ckpts[0].fine_tuned_model_checkpoint).owned_by
        == tenant_id
    )


# -- isolation -----------------------------------------------------------------------


def test_other_tenants_objects_are_404_like_missing_ones(svc):
    _, _, a = svc.tenant("a")
    _, _, b = svc.tenant("b")
    f = upload(a)
    job = create_job(a, f.id)
    svc.store.set_status(job.id, "queued")
    adapter = svc.store.root / "adapters" / job.id / "v1"
    adapter.mkdir(parents=True)
    ckpt = svc.store.record_checkpoint(job.id, 1, 1, adapter)
    ft = a.fine_tuning.jobs.retrieve(job.id).fine_tuned_model

    def same_as_missing(call, real_id, missing_id):
        with pytest.raises(openai.NotFoundError) as theirs:
            call(real_id)
        with pytest.raises(openai.NotFoundError) as none:
            call(missing_id)
        assert theirs.value.body == json.loads(
            json.dumps(none.value.body).replace(missing_id, real_id)
        )

    missing_job, missing_file = "ftjob-" + "0" * 24, "file-" + "0" * 24
    jobs = b.fine_tuning.jobs
    same_as_missing(jobs.retrieve, job.id, missing_job)
    same_as_missing(jobs.cancel, job.id, missing_job)
    same_as_missing(jobs.pause, job.id, missing_job)
    same_as_missing(jobs.list_events, job.id, missing_job)
    same_as_missing(jobs.checkpoints.list, job.id, missing_job)
    same_as_missing(b.files.retrieve, f.id, missing_file)
    same_as_missing(b.files.content, f.id, missing_file)
    same_as_missing(b.files.delete, f.id, missing_file)
    same_as_missing(b.models.retrieve, ft, ft + "x")
    same_as_missing(b.models.retrieve, ckpt.fine_tuned_model_checkpoint, ft + "x")
    # A's file as B's training file: exactly the answer for a file that is not there.
    with pytest.raises(openai.BadRequestError) as theirs:
        create_job(b, f.id)
    with pytest.raises(openai.BadRequestError) as none:
        create_job(b, missing_file)
    assert theirs.value.message.replace(f.id, "X") == none.value.message.replace(
        missing_file, "X"
    )
    assert theirs.value.body["param"] == "training_file"
    # A's ids as B's paging cursors.
    with pytest.raises(openai.BadRequestError) as e:
        b.fine_tuning.jobs.list(after=job.id)
    assert e.value.body["param"] == "after"
    assert list(b.fine_tuning.jobs.list()) == [] and list(b.files.list()) == []
    assert {m.id for m in b.models.list()} == {BASE}
    # A still sees everything.
    assert a.files.retrieve(f.id).id == f.id
    assert a.fine_tuning.jobs.checkpoints.list(job.id).data[0].id == ckpt.id


# -- auth ----------------------------------------------------------------------------


def test_missing_wrong_and_revoked_keys_are_401(svc):
    _, key, client = svc.tenant()
    upload(client)
    r = httpx.get(f"{svc.api.base_url}/files")
    assert r.status_code == 401 and r.json()["error"]["code"] == "missing_api_key"
    r = httpx.get(
        f"{svc.api.base_url}/files", headers={"Authorization": f"Basic {key}"}
    )
    assert r.status_code == 401
    bad = openai.OpenAI(
        base_url=svc.api.base_url, api_key=key[:-1] + ("A" if key[-1] != "A" else "B")
    )
    with pytest.raises(openai.AuthenticationError, match="Incorrect API key"):
        bad.files.list()
    name = svc.store.authenticate(key).name
    second = svc.store.issue_key(name)
    assert svc.store.revoke(name, second[:15]) == 1
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=svc.api.base_url, api_key=second).files.list()
    client.files.list()  # the first key still works
    svc.store.revoke(name)
    with pytest.raises(openai.AuthenticationError):
        client.files.list()


def test_limits_are_429_without_retries(svc):
    _, _, client = svc.tenant()
    f = upload(client)
    jobs = [create_job(client, f.id).id for _ in range(svc.cfg.max_queued_jobs)]
    refused = svc.metrics.requests.labels("POST", "/v1/fine_tuning/jobs", "429")
    n0 = refused._value.get()
    before = snapshot(svc.store)
    with pytest.raises(openai.RateLimitError, match="max_queued_jobs") as e:
        create_job(client, f.id)
    assert e.value.response.headers["x-should-retry"] == "false"
    assert refused._value.get() == n0 + 1  # one request: the SDK did not retry
    assert snapshot(svc.store) == before
    # Queued jobs still count; a job that starts running frees a slot.
    svc.store.set_status(jobs[0], "queued")
    with pytest.raises(openai.RateLimitError):
        create_job(client, f.id)
    svc.store.set_status(jobs[0], "running")
    create_job(client, f.id)
    for _ in range(svc.cfg.max_files - 1):
        upload(client, 1)
    with pytest.raises(openai.RateLimitError, match="max_files"):
        upload(client, 1)


# -- refusals of job requests ----------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, param, needle",
    [
        (dict(model="gpt-4o-mini"), "model", f"fine-tunes '{BASE}' and the fine-tuned"),
        (
            dict(method=hp(batch_size=-1)),
            "method.reinforcement.hyperparameters.batch_size",
            "batch_size",
        ),
        (
            dict(method=hp(n_epochs=0)),
            "method.reinforcement.hyperparameters.n_epochs",
            "n_epochs",
        ),
        (
            dict(method=hp(learning_rate_multiplier=-0.5)),
            "method.reinforcement.hyperparameters.learning_rate_multiplier",
            "(0, 100]",
        ),
        (
            dict(method=hp(compute_multiplier=1000)),
            "method.reinforcement.hyperparameters.compute_multiplier",
            "compute_multiplier",
        ),
        (
            dict(method=hp(batch_size=7)),
            "method.reinforcement.hyperparameters.batch_size",
            "6 examples",
        ),
        (
            dict(method=hp(eval_interval=True)),
            "method.reinforcement.hyperparameters.eval_interval",
            "integer",
        ),
        (
            dict(method=hp(reasoning_effort="high")),
            "method.reinforcement.hyperparameters.reasoning_effort",
            "not supported",
        ),
        (
            dict(method=hp(temperature=0.5)),
            "method.reinforcement.hyperparameters.temperature",
            "Unrecognized",
        ),
        (
            dict(
                method={
                    "type": "reinforcement",
                    "reinforcement": {
                        "grader": {"type": "exec", "source": "import os"}
                    },
                }
            ),
            "method.reinforcement.grader.type",
            "unknown grader type 'exec'",
        ),
        (
            dict(
                method={
                    "type": "reinforcement",
                    "reinforcement": {"grader": {"type": "marlaas", "kind": "chess"}},
                }
            ),
            "method.reinforcement.grader.kind",
            "kind must be one of",
        ),
        (
            dict(
                method={
                    "type": "reinforcement",
                    "reinforcement": {"grader": {**GRADER, "operation": "regex"}},
                }
            ),
            "method.reinforcement.grader.operation",
            "operation",
        ),
        (
            dict(method={"type": "ppo", "ppo": {}}),
            "method.type",
            "'ppo' is not supported",
        ),
        (dict(method=None), "method", "method is required"),
        (
            dict(extra_body={"hyperparameters": {"n_epochs": 3}}),
            "hyperparameters",
            "method.reinforcement",
        ),
        (
            dict(extra_body={"priority": 99}),
            "priority",
            "Unrecognized request argument",
        ),
        (dict(metadata={f"k{i}": "v" for i in range(17)}), "metadata", "at most 16"),
        (dict(metadata={"k": "v" * 513}), "metadata.k", "512"),
        (dict(suffix="a:b"), "suffix", "suffix"),
        (dict(seed=-1), "seed", "seed"),
        (dict(validation_file="file-nope"), "validation_file", "No such file"),
    ],
    ids=lambda v: v if isinstance(v, str) and "." not in v and " " not in v else None,
)
def test_bad_job_requests_are_400_naming_the_parameter(svc, kwargs, param, needle):
    _, _, client = svc.tenant()
    f = upload(client)
    kwargs = dict(kwargs)
    model = kwargs.pop("model", BASE)
    if kwargs.get("method", METHOD) is None:
        del kwargs["method"]  # leave it out entirely
    else:
        kwargs.setdefault("method", METHOD)
    before = snapshot(svc.store)
    with pytest.raises(openai.BadRequestError) as e:
        client.fine_tuning.jobs.create(model=model, training_file=f.id, **kwargs)
    assert e.value.body["param"] == param, e.value.body
    assert needle in e.value.message
    assert snapshot(svc.store) == before


def test_marlaas_grader_kind_is_accepted(svc):
    _, _, client = svc.tenant()
    f = upload(client)
    job = create_job(
        client,
        f.id,
        method={
            "type": "reinforcement",
            "reinforcement": {"grader": {"type": "marlaas", "kind": "addition"}},
        },
    )
    assert job.method.reinforcement.grader.type == "marlaas"


# -- hostile requests: status, message, and no other job changed -------------------


def hostile_requests(key, own_file, own_job, other_job, other_file, other_event):
    """(name, method, path, kwargs) sent with raw httpx."""
    auth = {"Authorization": f"Bearer {key}"}
    jh = {**auth, "Content-Type": "application/json"}
    good = {"model": BASE, "training_file": own_file, "method": METHOD}
    return [
        ("no auth header", "GET", "/fine_tuning/jobs", {}),
        (
            "bearer with empty key",
            "GET",
            "/fine_tuning/jobs",
            {"headers": {"Authorization": "Bearer"}},
        ),
        (
            "unknown key",
            "POST",
            "/fine_tuning/jobs",
            {"headers": {"Authorization": "Bearer sk-marlaas-forged"}, "json": good},
        ),
        (
            "malformed JSON body",
            "POST",
            "/fine_tuning/jobs",
            {"headers": jh, "content": b'{"model": '},
        ),
        (
            "JSON array body",
            "POST",
            "/fine_tuning/jobs",
            {"headers": jh, "content": b"[1,2]"},
        ),
        (
            "unknown top-level field",
            "POST",
            "/fine_tuning/jobs",
            {"headers": jh, "json": {**good, "tenant_id": "org-x"}},
        ),
        (
            "training_file of another tenant",
            "POST",
            "/fine_tuning/jobs",
            {"headers": jh, "json": {**good, "training_file": other_file}},
        ),
        (
            "cancel another tenant's job",
            "POST",
            f"/fine_tuning/jobs/{other_job}/cancel",
            {"headers": auth},
        ),
        (
            "pause another tenant's job",
            "POST",
            f"/fine_tuning/jobs/{other_job}/pause",
            {"headers": auth},
        ),
        (
            "events of another tenant's job",
            "GET",
            f"/fine_tuning/jobs/{other_job}/events",
            {"headers": auth},
        ),
        (
            "another tenant's job as list cursor",
            "GET",
            f"/fine_tuning/jobs?after={other_job}",
            {"headers": auth},
        ),
        (
            "content of another tenant's file",
            "GET",
            f"/files/{other_file}/content",
            {"headers": auth},
        ),
        (
            "delete another tenant's file",
            "DELETE",
            f"/files/{other_file}",
            {"headers": auth},
        ),
        (
            "delete a file a live job trains on",
            "DELETE",
            f"/files/{own_file}",
            {"headers": auth},
        ),
        (
            "path traversal in file id",
            "GET",
            "/files/..%2F..%2Fservice.db/content",
            {"headers": auth},
        ),
        ("limit=0", "GET", "/fine_tuning/jobs?limit=0", {"headers": auth}),
        ("limit not a number", "GET", "/fine_tuning/jobs?limit=abc", {"headers": auth}),
        (
            "event cursor of another job",
            "GET",
            f"/fine_tuning/jobs/{own_job}/events?after={other_event}",
            {"headers": auth},
        ),
        (
            "resume a job that is not paused",
            "POST",
            f"/fine_tuning/jobs/{own_job}/resume",
            {"headers": auth},
        ),
        (
            "JSON body over max_request_bytes",
            "POST",
            "/fine_tuning/jobs",
            {"headers": jh, "content": b" " * (300 * 1024)},
        ),
        (
            "upload without multipart",
            "POST",
            "/files",
            {"headers": jh, "json": {"purpose": "fine-tune"}},
        ),
        (
            "upload without a file part",
            "POST",
            "/files",
            {
                "headers": auth,
                "data": {"purpose": "fine-tune"},
                "files": {"x": ("a", b"1")},
            },
        ),
        (
            "chat with no model server attached",
            "POST",
            "/chat/completions",
            {"headers": jh, "json": {"model": BASE, "messages": []}},
        ),
        ("unknown route", "GET", "/fine_tuning/secrets", {"headers": auth}),
        ("wrong method", "PUT", f"/fine_tuning/jobs/{own_job}", {"headers": auth}),
        ("SQL in a job id", "GET", "/fine_tuning/jobs/x' OR '1'='1", {"headers": auth}),
        (
            "Idempotency-Key over 255 chars",
            "POST",
            "/fine_tuning/jobs",
            {"headers": {**jh, "Idempotency-Key": "k" * 300}, "json": good},
        ),
        (
            "metadata filter syntax",
            "GET",
            "/fine_tuning/jobs?metadata=team",
            {"headers": auth},
        ),
    ]


EXPECTED_STATUS = {
    "no auth header": 401,
    "bearer with empty key": 401,
    "unknown key": 401,
    "malformed JSON body": 400,
    "JSON array body": 400,
    "unknown top-level field": 400,
    "training_file of another tenant": 400,
    "cancel another tenant's job": 404,
    "pause another tenant's job": 404,
    "events of another tenant's job": 404,
    "another tenant's job as list cursor": 400,
    "content of another tenant's file": 404,
    "delete another tenant's file": 404,
    "delete a file a live job trains on": 409,
    "path traversal in file id": 404,
    "limit=0": 400,
    "limit not a number": 400,
    "event cursor of another job": 400,
    "resume a job that is not paused": 400,
    "JSON body over max_request_bytes": 413,
    "upload without multipart": 400,
    "upload without a file part": 400,
    "chat with no model server attached": 503,
    "unknown route": 404,
    "wrong method": 405,
    "SQL in a job id": 404,
    "Idempotency-Key over 255 chars": 400,
    "metadata filter syntax": 400,
}


def test_hostile_requests_change_nothing(svc, capsys):
    _, key, mine = svc.tenant("h")
    _, _, theirs = svc.tenant("v")
    own_file = upload(mine).id
    own_job = create_job(mine, own_file).id
    other_file = upload(theirs).id
    other_job = create_job(theirs, other_file).id
    other_event = (
        svc.store.record_step(other_job, 1, {"reward": 1.0})
        and (
            svc.store.list_events(svc.store.job(other_job).tenant_id, other_job).items[
                0
            ]
        )
    )
    table = []
    with httpx.Client(base_url=svc.api.base_url, timeout=30) as http:
        for name, method, path, kw in hostile_requests(
            key, own_file, own_job, other_job, other_file, f"ftevent-{other_event.id}"
        ):
            before = snapshot(svc.store)
            r = http.request(method, path, **kw)
            after = snapshot(svc.store)
            assert r.headers["content-type"] == "application/json", (name, r.text)
            err = r.json().get("error")
            assert isinstance(err, dict), (name, r.status_code, r.text)
            assert set(err) == {"message", "type", "param", "code"}, (name, err)
            assert r.status_code == EXPECTED_STATUS[name], (name, r.status_code, err)
            assert after == before, name
            table.append((name, method, path, r.status_code, err["message"]))
    assert len(table) >= 15
    with capsys.disabled():
        print("\n| request | status | message |\n|---|---|---|")
        for name, method, path, status, msg in table:
            print(f"| {name} (`{method} {path[:60]}`) | {status} | {msg} |")


# -- metrics -------------------------------------------------------------------------


def test_metrics_need_the_admin_key(svc):
    tenant_id, _, client = svc.tenant()
    create_job(client, upload(client).id)
    url = svc.api.url + "/metrics"
    assert httpx.get(url).status_code == 401
    admin = new_admin_key(svc.cfg.admin_key_path)
    assert httpx.get(url, headers={"Authorization": "Bearer nope"}).status_code == 401
    metrics = svc.metrics  # the object the scheduler side reports to
    metrics.observe_ttfs(tenant_id, 12.5)
    metrics.observe_step(tenant_id, 3.0)
    metrics.set_trainer_busy(0.75)
    metrics.set_kv_usage(1.7)
    tools = {"calls": 5, "errors": 2, "latency_s_mean": 0.3}
    metrics.observe_tools(tenant_id, tools, discarded=1)
    r = httpx.get(url, headers={"Authorization": f"Bearer {admin}"})
    assert r.status_code == 200
    text = r.text
    assert f'marlaas_jobs{{status="validating_files",tenant="{tenant_id}"}} 1.0' in text
    assert "marlaas_queue_length " in text
    assert f'marlaas_ttfs_seconds_count{{tenant="{tenant_id}"}} 1.0' in text
    assert f'marlaas_step_seconds_sum{{tenant="{tenant_id}"}} 3.0' in text
    assert "marlaas_trainer_busy_fraction 0.75" in text
    ok = f'marlaas_tool_calls_total{{outcome="ok",tenant="{tenant_id}"}} 3.0'
    assert ok in text
    assert f'marlaas_tool_call_seconds_sum{{tenant="{tenant_id}"}} 0.3' in text
    assert f'marlaas_discarded_groups_total{{tenant="{tenant_id}"}} 1.0' in text
    assert "marlaas_server_kv_usage_fraction 1.0" in text  # clamped
    assert (
        'marlaas_api_requests_total{code="200",method="POST",route="/v1/fine_tuning/jobs"}'
        in text
    )
