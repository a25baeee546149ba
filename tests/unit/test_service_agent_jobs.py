"""Agent jobs at the API (official ``openai`` SDK, real uvicorn, real SQLite):
OpenAI's Agent RFT job shape is accepted, checked field by field, held to the
operator's egress policy, and its secrets never come back."""

from __future__ import annotations

import json

import openai
import pytest

from areal_marlaas.config.service import EgressConfig
from tests.support.service_api import BASE, GRADER, service_fixture, upload

pytestmark = pytest.mark.filterwarnings("ignore:Pydantic serializer warnings")

svc = service_fixture(
    egress=EgressConfig(allow=[], tenants={"lab": ["127.0.0.0/8"]}),
    max_episode_steps=5,
)
SECRET = "Bearer sk-tenant-secret-0042"
PUBLIC_TOOL = "http://93.184.215.14/tools/lookup"  # a public address (never called)


def agent_method(grader: dict | None = None, tools=None, **rl) -> dict:
    return {
        "type": "reinforcement",
        "reinforcement": {
            "grader": grader or GRADER,
            "tools": tools
            if tools is not None
            else [
                {
                    "name": "lookup",
                    "server_url": PUBLIC_TOOL,
                    "headers": {"Authorization": SECRET},
                }
            ],
            "hyperparameters": {"batch_size": 1},
            **rl,
        },
    }


def create(client, method: dict):
    f = upload(client, 2)
    return client.fine_tuning.jobs.create(model=BASE, training_file=f.id, method=method)


def bad(client, method: dict) -> dict:
    with pytest.raises(openai.BadRequestError) as e:
        create(client, method)
    return e.value.body


def test_an_agent_job_is_stored_with_its_tools_and_shown_without_secrets(svc):
    _, _, client = svc.tenant()
    endpoint = {
        "type": "endpoint",
        "name": "judge",
        "url": "http://93.184.215.14/grade",
        "headers": {"X-Key": SECRET},
    }
    job = create(client, agent_method(endpoint, max_episode_steps=3))
    rl = job.method.reinforcement.model_dump()
    assert rl["tools"][0]["headers"] == {"Authorization": "<redacted>"}
    assert rl["grader"]["headers"] == {"X-Key": "<redacted>"}
    assert rl["max_episode_steps"] == 3
    for raw in (
        client.fine_tuning.jobs.retrieve(job.id).model_dump_json(),
        client.fine_tuning.jobs.list().model_dump_json(),
        json.dumps(
            [e.model_dump() for e in client.fine_tuning.jobs.list_events(job.id)]
        ),
    ):
        assert "sk-tenant-secret" not in raw
    # The store keeps them: the rollouts need them.
    stored = svc.store.get_job(job.organization_id, job.id).method["reinforcement"]
    assert stored["tools"][0]["headers"]["Authorization"] == SECRET


@pytest.mark.parametrize(
    "url,param",
    [
        ("http://169.254.169.254/latest", "method.reinforcement.tools.0.server_url"),
        ("http://10.1.2.3/tool", "method.reinforcement.tools.0.server_url"),
        ("http://localhost:8080/tool", "method.reinforcement.tools.0.server_url"),
    ],
)
def test_tools_at_private_or_metadata_addresses_are_refused(svc, url, param):
    _, _, client = svc.tenant()
    body = bad(client, agent_method(tools=[{"name": "lookup", "server_url": url}]))
    assert body["param"] == param
    assert "private, loopback, link-local" in body["message"]


def test_an_endpoint_grader_inside_multi_is_checked_too(svc):
    _, _, client = svc.tenant()
    multi = {
        "type": "multi",
        "name": "m",
        "graders": {
            "ok": GRADER,
            "remote": {"type": "endpoint", "name": "r", "url": "http://192.168.0.9/g"},
        },
        "calculate_output": "ok + remote",
    }
    body = bad(client, agent_method(multi))
    assert body["param"] == "method.reinforcement.grader.graders.remote.url"


def test_the_graders_run_route_applies_the_policy_too(svc):
    _, _, client = svc.tenant()
    with pytest.raises(openai.BadRequestError) as e:
        client.fine_tuning.alpha.graders.run(
            grader={"type": "endpoint", "name": "r", "url": "http://169.254.169.254/"},
            model_sample="x",
        )
    assert e.value.body["param"] == "grader.url"


def test_a_tenant_the_operator_allowed_may_reach_loopback(svc):
    svc.store.create_tenant("lab")
    key = svc.store.issue_key("lab")
    client = openai.OpenAI(base_url=svc.api.base_url, api_key=key)
    tools = [{"name": "lookup", "server_url": "http://127.0.0.1:9/tools/lookup"}]
    job = create(client, agent_method(tools=tools))
    assert job.status in ("validating_files", "queued")
    _, _, other = svc.tenant()
    assert bad(other, agent_method(tools=tools))["param"].endswith("server_url")


@pytest.mark.parametrize(
    "rl,param",
    [
        ({"max_episode_steps": 0}, "method.reinforcement.max_episode_steps"),
        ({"max_episode_steps": 6}, "method.reinforcement.max_episode_steps"),
        ({"tools": []}, "method.reinforcement.tools"),
        ({"tools": [{"name": "a b", "server_url": PUBLIC_TOOL}]}, None),
        ({"tools": [{"name": "a", "server_url": PUBLIC_TOOL, "x": 1}]}, None),
    ],
)
def test_bad_agent_fields_name_the_parameter(svc, rl, param):
    _, _, client = svc.tenant()
    body = bad(
        client,
        agent_method(**rl) if "tools" not in rl else agent_method(tools=rl["tools"]),
    )
    if param:
        assert body["param"] == param
    else:
        assert body["param"].startswith("method.reinforcement.tools.0.")


def test_max_episode_steps_without_tools_is_refused(svc):
    _, _, client = svc.tenant()
    method = {
        "type": "reinforcement",
        "reinforcement": {"grader": GRADER, "max_episode_steps": 2},
    }
    assert bad(client, method)["param"] == "method.reinforcement.max_episode_steps"


def test_graders_validate_redacts_endpoint_headers(svc):
    _, _, client = svc.tenant()
    out = client.fine_tuning.alpha.graders.validate(
        grader={
            "type": "endpoint",
            "name": "r",
            "url": "http://93.184.215.14/g",
            "headers": {"X-Key": SECRET},
            "rate_limit": 5,
        }
    )
    assert "sk-tenant-secret" not in out.model_dump_json()
