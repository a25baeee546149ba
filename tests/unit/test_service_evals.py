"""A job's validation runs through the SDK's ``client.evals``, and checkpoint
retention by their scores: what the scheduler records, the API serves, each
tenant its own only."""

from __future__ import annotations

import openai
import pytest

from areal_marlaas.rundir.records import EvalRecord, EvalSample
from areal_marlaas.service import eval_runs
from tests.support.service_api import GRADER, create_job, service_fixture, upload

MULTI = {
    "type": "multi",
    "name": "m",
    "graders": {"exact": GRADER, "again": GRADER | {"name": "again"}},
    "calculate_output": "0.5 * exact + 0.5 * again",
}


svc = service_fixture()


def sample(i: int, reward: float | None) -> EvalSample:
    grades = [
        {"name": "exact", "type": "string_check", "score": reward or 0.0},
        {"name": "again", "type": "string_check", "score": 1.0},
    ]
    s: EvalSample = {
        "index": i,
        "item": {"messages": [{"role": "user", "content": f"{i} + {i}?"}]},
        "prompt": f"{i} + {i}?",
        "output": str(2 * i),
        "reward": reward,
        "grades": grades if reward is not None else [],
    }
    if reward is None:
        s["error"] = "ConnectionError: gone"
    return s


def record(samples: list[EvalSample]) -> EvalRecord:
    ok = [s["reward"] for s in samples if s["reward"] is not None]
    return {
        "task": "t",
        "version": 1,
        "reward_mean": sum(ok) / len(ok),
        "samples": len(ok),
        "failed": len(samples) - len(ok),
        "graders": [],
        "start": 10.0,
        "end": 12.5,
        "versions": [1],
    }


def write_run(svc, job_id: str, step: int, samples: list[EvalSample]) -> str:
    eval_id = svc.store.ensure_eval(job_id, eval_runs.testing_criteria(MULTI))
    svc.store.record_eval_run(
        eval_id,
        step,
        f"ft:x:ckpt-step-{step}",
        "completed",
        eval_runs.run_result(record(samples), samples),
        eval_runs.output_items(samples, f"ft:x:ckpt-step-{step}", 1.0, 16),
    )
    return eval_id


def test_eval_runs_and_output_items_read_back_through_the_sdk(svc):
    _, _, a = svc.tenant()
    job = create_job(a, upload(a).id)
    samples = [sample(0, 1.0), sample(1, 0.0), sample(2, None)]
    eval_id = write_run(svc, job.id, 1, samples)
    write_run(svc, job.id, 2, [sample(0, 1.0)])

    assert a.fine_tuning.jobs.retrieve(job.id).eval_id == eval_id  # type: ignore[attr-defined]
    ev = a.evals.retrieve(eval_id)
    assert [c.name for c in ev.testing_criteria] == ["exact", "again"]
    runs = a.evals.runs.list(eval_id).data
    assert [r.name for r in runs] == ["step 1", "step 2"]
    first = runs[0]
    assert first.result_counts.total == 3 and first.result_counts.errored == 1
    assert (first.result_counts.passed, first.result_counts.failed) == (1, 1)
    assert first.reward_mean == pytest.approx(0.5)  # type: ignore[attr-defined]
    assert a.evals.runs.retrieve(first.id, eval_id=eval_id).id == first.id
    items = a.evals.runs.output_items.list(first.id, eval_id=eval_id).data
    assert [i.datasource_item_id for i in items] == [0, 1, 2]
    assert [i.status for i in items] == ["pass", "fail", "error"]
    assert items[0].sample.output[0].content == "0"
    assert items[0].sample.input[0].content == "0 + 0?"
    assert {r.name: r.score for r in items[1].results} == {"exact": 0.0, "again": 1.0}
    assert items[2].sample.error.message == "ConnectionError: gone"
    one = a.evals.runs.output_items.retrieve(
        items[1].id, eval_id=eval_id, run_id=first.id
    )
    assert one.id == items[1].id
    # Paging and filters.
    page = a.evals.runs.output_items.list(first.id, eval_id=eval_id, limit=2)
    assert len(page.data) == 2 and page.has_more
    rest = a.evals.runs.output_items.list(
        first.id, eval_id=eval_id, after=page.data[-1].id
    )
    assert [i.datasource_item_id for i in rest.data] == [2]
    fails = a.evals.runs.output_items.list(first.id, eval_id=eval_id, status="fail")
    assert [i.datasource_item_id for i in fails.data] == [1]
    newest = a.evals.runs.list(eval_id, order="desc", limit=1).data
    assert [r.name for r in newest] == ["step 2"]


def test_another_tenant_gets_404_on_the_eval_its_runs_and_items(svc):
    _, _, a = svc.tenant()
    _, _, b = svc.tenant()
    job = create_job(a, upload(a).id)
    eval_id = write_run(svc, job.id, 1, [sample(0, 1.0)])
    run = a.evals.runs.list(eval_id).data[0]
    item = a.evals.runs.output_items.list(run.id, eval_id=eval_id).data[0]

    with pytest.raises(openai.NotFoundError):
        b.evals.retrieve(eval_id)
    with pytest.raises(openai.NotFoundError):
        b.evals.runs.list(eval_id)
    with pytest.raises(openai.NotFoundError):
        b.evals.runs.retrieve(run.id, eval_id=eval_id)
    with pytest.raises(openai.NotFoundError):
        b.evals.runs.output_items.list(run.id, eval_id=eval_id)
    with pytest.raises(openai.NotFoundError):
        b.evals.runs.output_items.retrieve(item.id, eval_id=eval_id, run_id=run.id)
    assert eval_id not in {e.id for e in b.evals.list().data}
    assert eval_id in {e.id for e in a.evals.list().data}


def test_bad_list_parameters_are_400_naming_them(svc):
    _, _, a = svc.tenant()
    job = create_job(a, upload(a).id)
    eval_id = write_run(svc, job.id, 1, [sample(0, 1.0)])
    with pytest.raises(openai.BadRequestError, match="order"):
        a.evals.runs.list(eval_id, order="sideways")  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError, match="status"):
        a.evals.runs.list(eval_id, status="maybe")  # type: ignore[arg-type]


def test_retention_keeps_the_newest_and_the_best_by_the_score(svc, tmp_path):
    tenant_id, _, a = svc.tenant()
    job = create_job(a, upload(a).id)
    store = svc.store
    scores = {1: 0.9, 2: 0.1, 3: 0.5, 4: 0.7, 5: 0.2, 6: None}
    for step, v in scores.items():
        path = store.root / "adapters" / job.id / f"v{step}"
        path.mkdir(parents=True)
        metrics = {} if v is None else {"valid_reward_mean": v}
        store.record_checkpoint(job.id, step, step, path, metrics)
    dropped = store.prune_checkpoints(job.id, 3, "valid_reward_mean")
    assert sorted(step for step, _ in dropped) == [2, 5]
    kept = {c.step_number for c in store.list_checkpoints(tenant_id, job.id).items}
    assert kept == {1, 3, 4, 6}  # the best three, and the newest (unscored)
    # A step whose validation still runs is never dropped.
    assert store.prune_checkpoints(job.id, 1, "valid_reward_mean", frozenset({3})) == [
        (4, f"adapters/{job.id}/v4")
    ]
    assert store.prune_checkpoints(job.id, 0, "valid_reward_mean") == []


def test_retention_by_a_loss_keeps_the_lowest(svc):
    tenant_id, _, a = svc.tenant()
    job = create_job(a, upload(a).id)
    store = svc.store
    for step, v in {1: 0.9, 2: 0.1, 3: 0.5, 4: 0.7}.items():
        path = store.root / "adapters" / job.id / f"v{step}"
        path.mkdir(parents=True)
        store.record_checkpoint(job.id, step, step, path, {"valid_loss": v})

    dropped = store.prune_checkpoints(job.id, 2, "valid_loss", higher_is_better=False)

    assert sorted(step for step, _ in dropped) == [1]
    kept = {c.step_number for c in store.list_checkpoints(tenant_id, job.id).items}
    assert kept == {2, 3, 4}  # the two lowest losses, and the newest
