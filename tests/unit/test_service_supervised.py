"""Supervised and DPO jobs through the official SDK, up to the scheduler: a job
is created with OpenAI's method object and its plan, and every bad input is a
400 naming the field (the job is never created)."""

from __future__ import annotations

import re

import openai
import pytest

from areal_marlaas.service.jobs import task_spec
from tests.support.service_api import BASE, jsonl, service_fixture

svc = service_fixture()


def turn(role: str, content: str) -> dict:
    return {"role": role, "content": content}


GOOD = {"messages": [turn("user", "Say hi."), turn("assistant", "hi")]}
SFT = {"type": "supervised", "supervised": {"hyperparameters": {"batch_size": 2}}}


def upload(client, rows, name="train.jsonl"):
    return client.files.create(file=(name, jsonl(rows)), purpose="fine-tune")


def create(client, rows, method=None, valid_rows=None):
    kw = {}
    if valid_rows is not None:
        kw["validation_file"] = upload(client, valid_rows, "valid.jsonl").id
    return client.fine_tuning.jobs.create(
        model=BASE,
        training_file=upload(client, rows).id,
        method=method or SFT,  # type: ignore[arg-type]
        **kw,
    )


def test_a_supervised_job_is_created_with_openais_method_object_and_its_plan(svc):
    _, _, client = svc.tenant()

    job = create(client, [GOOD] * 5, valid_rows=[GOOD] * 2)

    assert job.status == "validating_files"
    assert job.method.type == "supervised" and job.method.reinforcement is None
    hp = job.method.supervised.hyperparameters  # type: ignore[union-attr]
    assert (hp.batch_size, hp.n_epochs, hp.learning_rate_multiplier) == (2, 1, 1.0)
    assert job.steps_total == 3  # type: ignore[attr-defined]  # 5 rows / 2


@pytest.mark.parametrize(
    ("rows", "valid_rows", "method", "param", "needle"),
    [
        (  # a demonstration must end with the assistant's turn
            [GOOD, {"messages": [turn("user", "Say hi.")]}],
            None,
            None,
            "training_file",
            "training_file line 2: the last message must be the assistant's",
        ),
        (
            [GOOD],
            [
                GOOD,
                {
                    "messages": [
                        turn("user", "a"),
                        turn("assistant", "b"),
                        turn("user", "c"),
                    ]
                },
            ],
            None,
            "validation_file",
            "validation_file line 2: the last message must be the assistant's",
        ),
        (  # over the service's max_prompt_tokens + max_new_tokens: 512 + 128
            [GOOD, {"messages": [turn("user", "word " * 700), turn("assistant", "x")]}],
            None,
            None,
            "training_file",
            r"training_file line 2: \d+ tokens, over the model's limit of 640",
        ),
        (
            [GOOD],
            None,
            {"type": "supervised", "supervised": {"grader": {"type": "x"}}},
            "method.supervised.grader",
            "is for reinforcement jobs",
        ),
        (
            [GOOD],
            None,
            {
                "type": "supervised",
                "supervised": {"hyperparameters": {"compute_multiplier": 2}},
            },
            "method.supervised.hyperparameters.compute_multiplier",
            "is for reinforcement jobs",
        ),
        (
            [GOOD],
            None,
            {"type": "supervised", "reinforcement": {"grader": {}}},
            "method.reinforcement",
            "is for reinforcement jobs and this is a supervised job",
        ),
        (
            [GOOD],
            None,
            {"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 0}}},
            "method.supervised.hyperparameters.n_epochs",
            "n_epochs must be 'auto' or an integer",
        ),
    ],
    ids=[
        "ends-with-user",
        "valid-ends-with-user",
        "over-the-context",
        "grader",
        "rl-hyperparameter",
        "rl-method-object",
        "n-epochs-0",
    ],
)
def test_bad_input_is_a_400_naming_the_field(
    svc, rows, valid_rows, method, param, needle
):
    _, _, client = svc.tenant()

    with pytest.raises(openai.BadRequestError) as e:
        create(client, rows, method, valid_rows)

    assert e.value.body["param"] == param  # type: ignore[index]
    assert re.search(needle, e.value.body["message"]), e.value.body  # type: ignore[index]
    assert not client.fine_tuning.jobs.list().data


PAIR = {
    "input": {"messages": [turn("user", "Say hi.")]},
    "preferred_output": [turn("assistant", "hi")],
    "non_preferred_output": [turn("assistant", "hello there")],
}


def dpo(**hp):
    return {"type": "dpo", "dpo": {"hyperparameters": {"batch_size": 2, **hp}}}


def test_a_dpo_job_is_created_with_openais_method_object_and_beta(svc):
    _, _, client = svc.tenant()

    job = create(client, [PAIR] * 4, dpo(beta=0.25))

    assert job.method.type == "dpo"
    hp = job.method.dpo.hyperparameters  # type: ignore[union-attr]
    assert (hp.beta, hp.batch_size, hp.n_epochs) == (0.25, 2, 1)
    assert job.steps_total == 2  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("rows", "method", "param", "needle"),
    [
        (
            [PAIR, {k: v for k, v in PAIR.items() if k != "non_preferred_output"}],
            dpo(),
            "training_file",
            "training_file line 2: needs non_preferred_output",
        ),
        (
            [PAIR, {**PAIR, "preferred_output": [turn("user", "x")]}],
            dpo(),
            "training_file",
            "preferred_output must be a list of exactly one assistant message",
        ),
        ([PAIR] * 2, dpo(beta=0), "method.dpo.hyperparameters.beta", "beta must"),
        ([PAIR] * 2, dpo(beta=-1.0), "method.dpo.hyperparameters.beta", "beta must"),
        (  # demonstrations are not pairs
            [GOOD],
            dpo(),
            "training_file",
            "training_file line 1: unknown field 'messages'",
        ),
        (
            [PAIR],
            {"type": "supervised"},
            "training_file",
            "training_file line 1: needs a non-empty 'messages' list",
        ),
        (
            [PAIR],
            {"type": "dpo", "dpo": {"hyperparameters": {"eval_samples": 3}}},
            "method.dpo.hyperparameters.eval_samples",
            "is for reinforcement jobs",
        ),
    ],
    ids=[
        "no-non-preferred",
        "preferred-not-assistant",
        "beta-0",
        "beta-negative",
        "demonstrations-as-pairs",
        "pairs-as-demonstrations",
        "rl-hyperparameter",
    ],
)
def test_bad_dpo_input_is_a_400_naming_the_field(svc, rows, method, param, needle):
    _, _, client = svc.tenant()

    with pytest.raises(openai.BadRequestError) as e:
        create(client, rows, method)

    assert e.value.body["param"] == param  # type: ignore[index]
    assert re.search(needle, e.value.body["message"]), e.value.body  # type: ignore[index]
    assert not client.fine_tuning.jobs.list().data


@pytest.mark.parametrize(
    ("message", "needle"),
    [
        (turn("", "x"), "has role ''"),
        (turn("robot", "x"), "has role 'robot'"),
    ],
    ids=["empty-role", "unknown-role"],
)
def test_a_turn_with_an_empty_or_unknown_role_is_refused_at_upload(
    svc, message, needle
):
    _, _, client = svc.tenant()

    with pytest.raises(openai.BadRequestError) as e:
        upload(client, [GOOD, {"messages": [message, turn("assistant", "y")]}])

    assert needle in e.value.body["message"] and "Line 2" in e.value.body["message"]  # type: ignore[index]


def task_spec_of(svc, job):
    return task_spec(
        svc.store.job(job.id),
        svc.cfg,
        svc.store.file_of_job(job.id),
        init_adapter=svc.store.start_adapter(job.id),
    )


def finished_model(svc, client, tmp_path):
    """A job of ``client``'s tenant with one checkpoint whose adapter folder
    holds recognizable bytes; returns the job and the checkpoint's name."""
    job = create(client, [GOOD] * 2)
    folder = svc.store.root / "adapters" / job.id / "v1"
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text('{"r": 8}')
    (folder / "adapter_model.safetensors").write_bytes(b"weights of " + job.id.encode())
    (folder / "optimizer.pt").write_bytes(b"not carried over")
    ckpt = svc.store.record_checkpoint(job.id, 1, 1, folder)
    return job, ckpt.fine_tuned_model_checkpoint


def test_a_job_continues_its_tenants_fine_tuned_model_from_its_adapter(svc, tmp_path):
    _, _, client = svc.tenant()
    earlier, ckpt_name = finished_model(svc, client, tmp_path)
    ft = client.fine_tuning.jobs.retrieve(earlier.id).fine_tuned_model
    assert ft is not None

    for model in (ft, ckpt_name):
        job = client.fine_tuning.jobs.create(
            model=model,
            training_file=upload(client, [GOOD] * 2).id,
            method=SFT,  # type: ignore[arg-type]
        )
        start = svc.store.start_adapter(job.id)
        assert job.model == model and start is not None
        assert (start / "adapter_model.safetensors").read_bytes() == (
            b"weights of " + earlier.id.encode()
        )
        assert not (start / "optimizer.pt").exists()  # a fresh optimizer
        spec = task_spec_of(svc, job)
        assert spec.init_adapter == str(start)
        assert job.id.split("-", 1)[1] in spec.name
    assert svc.store.start_adapter(earlier.id) is None  # it started fresh


def test_another_tenants_fine_tuned_model_is_a_404_naming_model(svc, tmp_path):
    _, _, a = svc.tenant()
    _, _, b = svc.tenant()
    earlier, ckpt_name = finished_model(svc, a, tmp_path)
    ft = a.fine_tuning.jobs.retrieve(earlier.id).fine_tuned_model
    train = upload(b, [GOOD] * 2)

    for model in (ft, ckpt_name, "ft:SmolLM2-135M-Instruct:nobody:nothing"):
        with pytest.raises(openai.NotFoundError) as e:
            b.fine_tuning.jobs.create(
                model=model,  # type: ignore[arg-type]
                training_file=train.id,
                method=SFT,  # type: ignore[arg-type]
            )
        assert e.value.body["param"] == "model"  # type: ignore[index]
    assert not b.fine_tuning.jobs.list().data
