"""What a job becomes (a task spec) and the line-by-line checks of its files
against its grader, before any training."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from areal_marlaas.config.service import ServiceConfig
from areal_marlaas.graders import parse_grader
from areal_marlaas.service.jobs import (
    JobFileError,
    check_lines,
    item_refs,
    task_spec,
    to_admit,
)

GRADER = {
    "type": "string_check",
    "name": "g",
    "input": "{{ sample.output_text }}",
    "reference": "{{ item.answer }}",
    "operation": "like",
}


def write(tmp_path, rows, name="t.jsonl"):
    p = tmp_path / name
    p.write_text(
        "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)
    )
    return p


def row(q="What is 1 + 1?", **extra):
    return {"messages": [{"role": "user", "content": q}], **extra}


def test_good_lines_pass_and_long_prompts_are_counted(tmp_path, tokenizer):
    path = write(tmp_path, [row(answer="2"), row("x " * 400, answer="1")])

    assert check_lines(path, GRADER, tokenizer, 64, "training_file") == (2, 1)


@pytest.mark.parametrize(
    "rows, message",
    [
        ([row(answer="2"), "{not json"], "line 2: not valid JSON"),
        ([row(answer="2"), row()], "training_file line 2: the grader reads"),
        (
            [{"messages": [{"role": "assistant", "content": "hi"}], "answer": "1"}],
            "line 1: the last message must be the user's turn",
        ),
        ([{"prompt": "x", "answer": "1"}], "line 1: needs a non-empty 'messages'"),
        ([row("x " * 400, answer="1")], "every prompt is longer than"),
    ],
)
def test_bad_files_name_the_line_and_the_fix(tmp_path, tokenizer, rows, message):
    path = write(tmp_path, rows)

    with pytest.raises(JobFileError, match=message) as e:
        check_lines(path, GRADER, tokenizer, 64, "training_file")
    assert e.value.param == "training_file"


def test_a_marlaas_kind_needs_its_fields(tmp_path, tokenizer):
    path = write(tmp_path, [row(answer="2"), row()])
    marlaas = {"type": "marlaas", "kind": "addition"}

    with pytest.raises(JobFileError, match="line 2: the 'addition' grader reads"):
        check_lines(path, marlaas, tokenizer, 64, "validation_file")


def test_multi_grader_refs_are_found_in_sub_graders():
    multi = {
        "type": "multi",
        "name": "m",
        "graders": {
            "a": GRADER,
            "b": dict(GRADER, reference="{{ item.meta.gold }}"),
        },
        "calculate_output": "a + b",
    }
    refs = {r.text for _, r in item_refs(parse_grader(multi))}
    assert refs == {"{{ item.answer }}", "{{ item.meta.gold }}"}


def test_a_job_becomes_a_task_spec(tmp_path):
    job = SimpleNamespace(
        task_name="job_abc",
        hyperparameters={"batch_size": 3, "group_size": 4, "learning_rate": 2e-4},
        method={"type": "reinforcement", "reinforcement": {"grader": GRADER}},
        steps_total=7,
        seed=5,
        tenant_id="org-1",
    )
    svc = ServiceConfig(max_new_tokens=32, max_prompt_tokens=200, temperature=0.9)

    spec = task_spec(job, svc, tmp_path / "t.jsonl", weight=2.0)

    assert (spec.name, spec.kind, spec.grader) == ("job_abc", "", GRADER)
    assert (spec.tenant, spec.weight) == ("org-1", 2.0)
    assert (spec.batch_size, spec.n_samples, spec.total_steps) == (3, 4, 7)
    assert (spec.lr, spec.seed, spec.temperature) == (2e-4, 5, 0.9)
    assert spec.dataset.format == "messages"
    assert spec.max_new_tokens == 32 and spec.max_prompt_tokens == 200
    kind = SimpleNamespace(
        **{
            **vars(job),
            "method": {
                "type": "reinforcement",
                "reinforcement": {"grader": {"type": "marlaas", "kind": "gsm8k"}},
            },
        }
    )
    spec = task_spec(kind, svc, tmp_path / "t.jsonl")
    assert spec.kind == "gsm8k" and spec.grader is None
    assert spec.reward_fn_path.endswith("numeric_answer_reward_fn")


def test_admission_keeps_a_full_pool_queued_and_takes_running_jobs_back():
    def job(name, tenant, status="queued"):
        return SimpleNamespace(task_name=name, tenant_id=tenant, status=status)

    a1, a2, a3 = job("a1", "A"), job("a2", "A"), job("a3", "A")
    b1 = job("b1", "B")
    # Oldest first; A may run 2 jobs: a3 waits, b1 goes.
    assert [j.task_name for j in to_admit([a1, a2, a3, b1], {}, 2, 10)] == [
        "a1",
        "a2",
        "b1",
    ]
    # Already held jobs count toward the limit and are not taken twice.
    assert [j.task_name for j in to_admit([a1, a2, a3], {"a1": "A"}, 2, 10)] == ["a2"]
    # After a restart, a job that was running is taken back even past the limit.
    back = job("a4", "A", "running")
    assert [j.task_name for j in to_admit([back], {"a1": "A", "a2": "A"}, 2, 10)] == [
        "a4"
    ]
    # The scheduler's own cap.
    assert [j.task_name for j in to_admit([a1, a2, b1], {}, 5, 2)] == ["a1", "a2"]


def _running_job(tmp_path):
    """A job store with one running 4-step job, and an empty run store."""
    from areal_marlaas.rundir.writer import RunStore
    from areal_marlaas.service.store import JobStore, NewJob

    jobs = JobStore(f"sqlite:///{tmp_path / 'db.sqlite'}", tmp_path)
    tenant, _ = jobs.create_tenant("acme")
    f = jobs.add_file(tenant.id, "t.jsonl", "fine-tune", b"{}\n", 1)
    job, _ = jobs.create_job(
        tenant.id, NewJob("m", f.id, None, {}, {}, None, 0, None, steps_total=4)
    )
    jobs.set_status(job.id, "queued")
    jobs.set_status(job.id, "running")
    store = RunStore(tmp_path / "runs" / "x", fresh=True)
    return jobs, tenant, job, store


def test_restart_records_checkpoints_the_run_store_committed_but_the_db_missed(
    tmp_path,
):
    """A crash between the run store's commit and the database write: the next
    start adds exactly the missing checkpoints (none twice)."""
    from areal_marlaas.config.service import ServiceConfig
    from areal_marlaas.service.recorder import JobRecorder

    jobs, _, job, store = _running_job(tmp_path)
    for v in range(3):  # v0, v1, v2 committed in the run store
        d = store.adapter_dir(job.task_name, v)
        d.mkdir(parents=True)
        (d / "adapter_model.safetensors").write_bytes(b"x")
        store.step({"task": job.task_name, "version": v, "reward_mean": 0.5})
        store.commit(job.task_name, v, {"cursor": 0, "steps": v})
    jobs.record_checkpoint(job.id, 1, 1, store.adapter_dir(job.task_name, 1))
    recorder = JobRecorder(jobs, store, ServiceConfig(root=str(tmp_path)))

    recorder.reconcile()
    recorder.reconcile()  # idempotent

    assert jobs.checkpoint_steps(job.id) == {1, 2}
    assert jobs.job(job.id).steps_done == 2
    jobs.close()


def test_restart_gives_a_step_whose_validation_never_returned_its_metrics_event(
    tmp_path,
):
    """A restart between a step's commit and its eval's return: the step was
    recorded without its metrics event (it waited for the validation); the next
    start writes it without validation scores, once, with a warning."""
    from areal_marlaas.config.service import ServiceConfig
    from areal_marlaas.service import step_metrics
    from areal_marlaas.service.recorder import JobRecorder

    jobs, tenant, job, store = _running_job(tmp_path)
    jobs.ensure_eval(job.id, [])
    for v in (1, 2):
        d = store.adapter_dir(job.task_name, v)
        d.mkdir(parents=True)
        (d / "adapter_model.safetensors").write_bytes(b"x")
        row = {"task": job.task_name, "version": v, "reward_mean": 0.25 * v}
        store.step(row)
        store.commit(job.task_name, v, {"cursor": 0, "steps": v})
        data = step_metrics.step_data(row, 4)  # type: ignore[arg-type]
        jobs.record_step(job.id, v, data, event=v == 1)  # v2's eval never returned
        jobs.record_checkpoint(job.id, v, v, d)
    assert jobs.metrics_steps(job.id) == {1}
    recorder = JobRecorder(jobs, store, ServiceConfig(root=str(tmp_path)))

    recorder.reconcile()
    recorder.reconcile()  # idempotent

    assert jobs.metrics_steps(job.id) == {1, 2}
    events = jobs.list_events(tenant.id, job.id, limit=100).items
    metrics = [e for e in events if e.type == "metrics" and e.data["step"] == 2]
    assert len(metrics) == 1
    assert metrics[0].data["scores"]["train_reward_mean"] == 0.5
    assert "valid_reward_mean" not in metrics[0].data["scores"]
    assert sum("validation did not finish" in e.message for e in events) == 1
    jobs.close()
