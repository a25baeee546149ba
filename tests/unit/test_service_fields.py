"""Every field of the SDK's job-create parameters and of its reinforcement and
supervised hyperparameters (and every method type) is honored (it shows on the
job, and the trainer gets it) or refused with a 400 naming it. The field lists
come from the SDK's own type definitions: a field a new SDK adds fails here
until it is classified."""

from __future__ import annotations

from typing import Any, get_args, get_type_hints

import openai
import pytest
from openai.types.fine_tuning.dpo_hyperparameters_param import (
    DpoHyperparametersParam,
)
from openai.types.fine_tuning.dpo_method_param import DpoMethodParam
from openai.types.fine_tuning.job_create_params import JobCreateParams, Method
from openai.types.fine_tuning.reinforcement_hyperparameters_param import (
    ReinforcementHyperparametersParam,
)
from openai.types.fine_tuning.reinforcement_method_param import (
    ReinforcementMethodParam,
)
from openai.types.fine_tuning.supervised_hyperparameters_param import (
    SupervisedHyperparametersParam,
)
from openai.types.fine_tuning.supervised_method_param import SupervisedMethodParam

from areal_marlaas.service.jobs import task_spec
from tests.support.service_api import GRADER, jsonl, service_fixture, upload

HP = "method.reinforcement.hyperparameters"


svc = service_fixture()


def method(**hp) -> dict:
    return {"type": "reinforcement", "reinforcement": {"grader": GRADER, **hp}}


# field -> (value, how the created job shows it) for honored fields; the
# required ones (model, training_file, method) are in every request.
HONORED_CREATE: dict[str, tuple[Any, Any]] = {
    "metadata": ({"team": "a"}, lambda job, spec: job.metadata == {"team": "a"}),
    "seed": (7, lambda job, spec: job.seed == 7 == spec.seed),
    "suffix": ("mine", lambda job, spec: job.user_provided_suffix == "mine"),
    "validation_file": (
        "VALID",
        lambda job, spec: (
            job.validation_file is not None and spec.eval_dataset is not None
        ),
    ),
}
REFUSED_CREATE: dict[str, Any] = {
    "hyperparameters": {"n_epochs": 2},
    "integrations": [{"type": "wandb", "wandb": {"project": "p"}}],
}
REQUIRED = {"model", "training_file", "method"}

HONORED_HP: dict[str, tuple[Any, Any]] = {
    "batch_size": (3, lambda job, spec: spec.batch_size == 3),
    "compute_multiplier": (2, lambda job, spec: spec.n_samples == 8),
    "eval_interval": (2, lambda job, spec: spec.eval_interval == 2),
    "eval_samples": (5, lambda job, spec: spec.eval_samples == 5),
    "learning_rate_multiplier": (
        2.0,
        lambda job, spec: spec.lr == pytest.approx(2 * 1e-4),
    ),
    "n_epochs": (2, lambda job, spec: spec.total_steps == 4),  # 6 rows x 2 / 3
}
REFUSED_HP: dict[str, Any] = {"reasoning_effort": "high"}


def test_every_sdk_field_is_classified():
    assert set(JobCreateParams.__annotations__) == (
        REQUIRED | set(HONORED_CREATE) | set(REFUSED_CREATE)
    )
    assert set(ReinforcementHyperparametersParam.__annotations__) == set(
        HONORED_HP
    ) | set(REFUSED_HP)
    assert set(ReinforcementMethodParam.__annotations__) == {
        "grader",
        "hyperparameters",
    }


def spec_of(svc, job):
    row = svc.store.job(job.id)
    valid = (
        svc.store.file_of_job(job.id, "validation_file")
        if job.validation_file
        else None
    )
    return task_spec(row, svc.cfg, svc.store.file_of_job(job.id), valid)


@pytest.mark.parametrize("field", sorted(HONORED_CREATE))
def test_create_field_is_honored(svc, field):
    _, _, client = svc.tenant()
    train = upload(client)
    value, shows = HONORED_CREATE[field]
    if field == "validation_file":
        value = upload(client, 3, "valid.jsonl").id
    job = client.fine_tuning.jobs.create(
        model="SmolLM2-135M-Instruct",
        training_file=train.id,
        method=method(hyperparameters={"batch_size": 3}),  # type: ignore[arg-type]
        **{field: value},
    )
    assert shows(job, spec_of(svc, job))


@pytest.mark.parametrize("field", sorted(REFUSED_CREATE))
def test_create_field_is_refused_naming_it(svc, field):
    _, _, client = svc.tenant()
    train = upload(client)
    with pytest.raises(openai.BadRequestError) as e:
        client.fine_tuning.jobs.create(
            model="SmolLM2-135M-Instruct",
            training_file=train.id,
            method=method(),  # type: ignore[arg-type]
            **{field: REFUSED_CREATE[field]},
        )
    assert e.value.body["param"] == field  # type: ignore[index]


@pytest.mark.parametrize("field", sorted(HONORED_HP))
def test_hyperparameter_is_honored(svc, field):
    _, _, client = svc.tenant()
    train = upload(client)
    value, shows = HONORED_HP[field]
    hp = {"batch_size": 3, field: value}
    job = client.fine_tuning.jobs.create(
        model="SmolLM2-135M-Instruct",
        training_file=train.id,
        method=method(hyperparameters=hp),  # type: ignore[arg-type]
        validation_file=upload(client, 3, "valid.jsonl").id,
    )
    assert getattr(job.method.reinforcement.hyperparameters, field) == value  # type: ignore[union-attr]
    assert shows(job, spec_of(svc, job))


@pytest.mark.parametrize("field", sorted(REFUSED_HP))
def test_hyperparameter_is_refused_naming_it(svc, field):
    _, _, client = svc.tenant()
    train = upload(client)
    with pytest.raises(openai.BadRequestError) as e:
        client.fine_tuning.jobs.create(
            model="SmolLM2-135M-Instruct",
            training_file=train.id,
            method=method(hyperparameters={field: REFUSED_HP[field]}),  # type: ignore[arg-type]
        )
    assert e.value.body["param"] == f"{HP}.{field}"  # type: ignore[index]


# -- supervised jobs --------------------------------------------------------------
SFT_HP = "method.supervised.hyperparameters"
HONORED_SFT_HP: dict[str, tuple[Any, Any]] = {
    "batch_size": (3, lambda job, spec: spec.batch_size == 3),
    "learning_rate_multiplier": (
        2.0,
        lambda job, spec: spec.lr == pytest.approx(2 * 1e-3),
    ),
    "n_epochs": (2, lambda job, spec: spec.total_steps == 4),  # 6 rows x 2 / 3
}
HONORED_DPO_HP: dict[str, tuple[Any, Any]] = {
    **HONORED_SFT_HP,
    "beta": (0.5, lambda job, spec: spec.beta == 0.5),
}
# method.type -> honored (a job is created) or refused (400 naming method.type).
HONORED_TYPES = {"reinforcement", "supervised", "dpo"}
REFUSED_TYPES: set[str] = set()


def demonstrations(client, n: int = 6, name: str = "sft.jsonl"):
    rows = [
        {
            "messages": [
                {"role": "user", "content": f"Say w{i} twice."},
                {"role": "assistant", "content": f"w{i} w{i}"},
            ]
        }
        for i in range(n)
    ]
    return client.files.create(file=(name, jsonl(rows)), purpose="fine-tune")


def preference_pairs(client, n: int = 6, name: str = "dpo.jsonl"):
    rows = [
        {
            "input": {"messages": [{"role": "user", "content": f"Say w{i} twice."}]},
            "preferred_output": [{"role": "assistant", "content": f"w{i} w{i}"}],
            "non_preferred_output": [{"role": "assistant", "content": f"w{i}"}],
        }
        for i in range(n)
    ]
    return client.files.create(file=(name, jsonl(rows)), purpose="fine-tune")


def test_every_sdk_supervised_dpo_field_and_method_type_is_classified():
    assert set(SupervisedHyperparametersParam.__annotations__) == set(HONORED_SFT_HP)
    assert set(SupervisedMethodParam.__annotations__) == {"hyperparameters"}
    assert set(DpoHyperparametersParam.__annotations__) == set(HONORED_DPO_HP)
    assert set(DpoMethodParam.__annotations__) == {"hyperparameters"}
    types = set(get_args(get_type_hints(Method)["type"]))
    assert types == HONORED_TYPES | REFUSED_TYPES


@pytest.mark.parametrize("field", sorted(HONORED_SFT_HP))
def test_supervised_hyperparameter_is_honored(svc, field):
    _, _, client = svc.tenant()
    value, shows = HONORED_SFT_HP[field]
    job = client.fine_tuning.jobs.create(
        model="SmolLM2-135M-Instruct",
        training_file=demonstrations(client).id,
        method={
            "type": "supervised",
            "supervised": {"hyperparameters": {"batch_size": 3, field: value}},
        },
    )
    assert job.method.type == "supervised"
    assert getattr(job.method.supervised.hyperparameters, field) == value  # type: ignore[union-attr]
    spec = spec_of(svc, job)
    assert spec.method == "sft" and shows(job, spec)


@pytest.mark.parametrize("field", sorted(HONORED_DPO_HP))
def test_dpo_hyperparameter_is_honored(svc, field):
    _, _, client = svc.tenant()
    value, shows = HONORED_DPO_HP[field]
    job = client.fine_tuning.jobs.create(
        model="SmolLM2-135M-Instruct",
        training_file=preference_pairs(client).id,
        method={
            "type": "dpo",
            "dpo": {"hyperparameters": {"batch_size": 3, field: value}},
        },
    )
    assert job.method.type == "dpo"
    assert getattr(job.method.dpo.hyperparameters, field) == value  # type: ignore[union-attr]
    spec = spec_of(svc, job)
    assert spec.method == "dpo" and shows(job, spec)


def test_an_unknown_method_type_names_method_type(svc):
    _, _, client = svc.tenant()
    with pytest.raises(openai.BadRequestError) as e:
        client.fine_tuning.jobs.create(
            model="SmolLM2-135M-Instruct",
            training_file=demonstrations(client).id,
            method={"type": "ppo"},  # type: ignore[typeddict-item]
        )
    assert e.value.body["param"] == "method.type"  # type: ignore[index]
