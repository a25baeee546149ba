"""The dashboard at /dashboard in a real headless Chromium (Debian's, driven by
playwright) against a real service API on SQLite: what a tenant and the operator
see, that it updates while a job runs, and that the page reaches only what the
signed-in key reaches through the API."""

from __future__ import annotations

import json
import time
from urllib.parse import urlparse

import httpx
import pytest

from areal_marlaas.rundir.records import EvalRecord, EvalSample, StepRecord
from areal_marlaas.service import eval_runs, step_metrics
from areal_marlaas.service.auth import new_admin_key
from areal_marlaas.service.tables import QUEUED, RUNNING, VALIDATING
from tests.support.dashboard import DashboardPage, chromium
from tests.support.service_api import GRADER, create_job, start_service, upload

MULTI = {
    "type": "multi",
    "name": "m",
    "graders": {"exact": GRADER, "again": GRADER | {"name": "again"}},
    "calculate_output": "0.5 * exact + 0.5 * again",
}
METHOD = {"type": "reinforcement", "reinforcement": {"grader": MULTI}}
XSS = '<img src=x onerror="window.pwned=1"><script>window.pwned=1</script>'

pytestmark = pytest.mark.timeout(300)


def step_record(version: int, reward: float, t: float) -> StepRecord:
    graders = [
        {
            "name": name,
            "type": "string_check",
            "reward_mean": reward if name == "exact" else 1.0,
            "samples": 8,
            "errors": {},
            "seconds_mean": 0.001,
            "prompt_tokens": 0,
            "completion_tokens": 0,
        }
        for name in ("exact", "again")
    ]
    return {
        "task": "t",
        "version": version,
        "reward_mean": 0.5 * reward + 0.5,
        "staleness_max": 0,
        "n_trajectories": 8,
        "trained_tokens": 160,
        "rollout_s": 4.0 + version,
        "queue_wait_s": 0.5,
        "trainer": 0,
        "train_s": 2.0,
        "t_commit": t,
        "loss": 0.1 / version,
        "grad_norm": 1.0,
        "logprob_gap_mean": 1e-6,
        "logprob_gap_max": 2e-6,
        "audited_tokens": 160,
        "page_faults": 0,
        "graders": graders,  # type: ignore[typeddict-item]
        "discarded_groups": 0,
        "tools": {
            "rollouts": 8,
            "calls": 8 + version,
            "sent": 8 + version,
            "calls_per_rollout": (8 + version) / 8,
            "tokens_per_call": 12.0,
            "latency_s_mean": 0.2,
            "errors": 1,
            "turns_mean": 2.0,
        },
    }


def eval_samples(step: int) -> list[EvalSample]:
    out: list[EvalSample] = []
    for i in range(4):
        ok = i < step  # more pass as the job learns
        out.append(
            {
                "index": i,
                "item": {"messages": [{"role": "user", "content": f"{i} + {i}?"}]},
                "prompt": f"What is {i} + {i}?",
                "output": XSS if i == 3 else (str(2 * i) if ok else "no idea"),
                "reward": 1.0 if ok else 0.25,
                "grades": [
                    {"name": "exact", "type": "string_check", "score": float(ok)},
                    {"name": "again", "type": "string_check", "score": 1.0},
                ],
            }
        )
    # A tool agent's sample: its whole conversation.
    out[0]["conversation"] = [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": '{"key": "0"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "zero is 0"},
        {"role": "assistant", "content": out[0]["output"]},
    ]
    return out


def commit_step(svc, job_id: str, eval_id: str, step: int) -> None:
    """What the runner writes for a committed, evaluated step."""
    t = time.time()
    r = step_record(step, reward=step / 5, t=t)
    samples = eval_samples(step)
    rewards = [s["reward"] for s in samples if s["reward"] is not None]
    rec: EvalRecord = {
        "task": "t",
        "version": step,
        "reward_mean": sum(rewards) / len(rewards),
        "samples": len(rewards),
        "failed": 0,
        "graders": [
            {
                "name": n,
                "type": "string_check",
                "reward_mean": sum(
                    g["score"] for s in samples for g in s["grades"] if g["name"] == n
                )
                / len(samples),
                "samples": len(samples),
                "errors": {},
                "seconds_mean": 0.0,
                "prompt_tokens": 0,
                "completion_tokens": 0,
            }
            for n in ("exact", "again")
        ],
        "start": t,
        "end": t + 1.5,
        "versions": [step],
    }
    valid = {"reward_mean": rec["reward_mean"], "graders": rec["graders"]}
    data = step_metrics.step_data(r, 5, valid=valid, eval_s=1.5)
    svc.store.record_step(
        job_id,
        step,
        data,
        # Hours ahead: still ahead whenever a test of this module reads it.
        estimated_finish=t + (5 - step) * 3600.0,
        trained_tokens=160 * step,
        at=t,
    )
    folder = svc.cfg.root_dir / "adapters" / job_id / str(step)
    folder.mkdir(parents=True, exist_ok=True)
    svc.store.record_checkpoint(
        job_id, step, step, folder, step_metrics.checkpoint_metrics(data)
    )
    model = f"ft:x:ckpt-step-{step}"
    svc.store.record_eval_run(
        eval_id,
        step,
        model,
        "completed",
        eval_runs.run_result(rec, samples),
        eval_runs.output_items(samples, model, 1.0, 16),
    )


@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    service = start_service(tmp_path_factory.mktemp("dash"))
    yield service
    service.api.stop()
    service.store.close()


@pytest.fixture(scope="module")
def world(svc):
    """Tenant a: a running job with 2 evaluated steps and a queued one; tenant b:
    a job of its own; the operator's admin key."""
    _, key_a, a = svc.tenant("a")
    _, key_b, b = svc.tenant("b")
    f = upload(a)
    job = create_job(a, f.id, validation_file=upload(a).id, method=METHOD)
    queued = create_job(a, f.id)
    other = create_job(b, upload(b).id)
    for j in (job.id, queued.id, other.id):
        svc.store.set_status(j, VALIDATING)
        svc.store.set_status(j, QUEUED)
    svc.store.set_status(job.id, RUNNING)
    svc.store.set_plan(job.id, steps_total=5)
    eval_id = svc.store.ensure_eval(job.id, eval_runs.testing_criteria(MULTI))
    for step in (1, 2):
        commit_step(svc, job.id, eval_id, step)
    svc.metrics.set_trainer_busy(0.42)
    svc.metrics.set_kv_usage(0.17)
    return {
        "key_a": key_a,
        "key_b": key_b,
        "admin": new_admin_key(svc.cfg.admin_key_path),
        "job": job.id,
        "queued": queued.id,
        "other": other.id,
        "eval_id": eval_id,
    }


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


@pytest.fixture
def page(browser, svc):
    p = DashboardPage(browser, svc.api.base_url.removesuffix("/v1"))
    yield p
    p.close()


def test_a_tenant_sees_its_jobs_and_no_other_tenants(page, world):
    page.sign_in(world["key_a"])
    page.page.wait_for_selector(f'tr[data-job="{world["job"]}"]')
    shown = page.page.eval_on_selector_all(
        "tr[data-job]", "rows => rows.map(r => r.dataset.job)"
    )
    assert set(shown) == {world["job"], world["queued"]}
    row = page.page.locator(f'tr[data-job="{world["job"]}"]')
    assert "2/5" in row.inner_text() and "running" in row.inner_text()
    assert "in " in row.inner_text()  # the ETA from estimated_finish
    assert page.errors == []


def test_the_key_stays_in_session_storage_and_out_of_urls(page, world, svc):
    page.sign_in(world["key_a"], f"#/jobs/{world['job']}")
    page.page.wait_for_selector('[data-chart="reward"][data-points="2"]')
    stored = page.page.evaluate("sessionStorage.getItem('marlaas.apiKey')")
    assert stored == world["key_a"]
    assert page.page.evaluate("localStorage.length") == 0
    origin = urlparse(svc.api.base_url).netloc
    assert page.requests, "the page made no request"
    for r in page.requests:
        assert urlparse(r.url).netloc == origin, r.url  # nothing from elsewhere
        assert world["key_a"] not in r.url
        if urlparse(r.url).path.startswith("/v1/"):
            assert r.headers.get("authorization") == f"Bearer {world['key_a']}"


def test_a_job_page_charts_every_step_per_grader_and_updates_live(page, world, svc):
    page.sign_in(world["key_a"], f"#/jobs/{world['job']}")
    p = page.page
    p.wait_for_selector('[data-chart="reward"][data-points="2"]')
    series = lambda name: p.get_attribute(f'[data-chart="{name}"]', "data-series")  # noqa: E731
    assert series("reward") == "train|validation"
    assert series("graders") == "exact train|exact valid|again train|again valid"
    assert series("timing") == "sampling|training|eval|full iteration"
    assert series("tools") == ("calls per rollout|errors|latency (s)|discarded groups")
    p.wait_for_selector('[data-chart="tools"][data-points="2"]')
    assert p.locator('[data-chart="reward"] canvas').count() == 1
    assert p.locator(".checkpoints tr[data-step]").count() == 2
    page.shot("job")
    commit_step(svc, world["job"], world["eval_id"], 3)  # the job goes on
    p.wait_for_selector('[data-chart="reward"][data-points="3"]', timeout=15_000)
    assert "3/5" in p.inner_text('[data-fact="steps"]')
    assert p.locator(".checkpoints tr[data-step]").count() == 3
    assert "Step 3/5" in p.inner_text(".events")
    assert page.errors == []


def test_the_sample_viewer_shows_eval_outputs_with_scores_as_text(page, world):
    page.sign_in(world["key_a"], f"#/jobs/{world['job']}")
    p = page.page
    p.wait_for_selector(".samples tr[data-item]")
    rows = p.locator(".samples tr[data-item]")
    assert rows.count() == 4
    first = p.inner_text('.samples tr[data-item="0"]')
    assert "0 + 0?" in first and "exact: 1.000" in first
    # A tool agent's conversation: its calls with arguments, the tool's output.
    assert 'lookup({"key": "0"})' in first and "[tool] zero is 0" in first
    # Model output is text, never markup.
    assert XSS in p.inner_text('.samples tr[data-item="3"]')
    assert p.evaluate("window.pwned") is None
    p.select_option("select.run-picker", index=0)  # step 1: one passed
    p.select_option("select.status-picker", "fail")
    p.wait_for_selector('.samples[data-items="3"]')
    assert "no idea" in p.inner_text(".samples tbody")
    assert p.locator('.samples tr[data-item="0"]').count() == 0
    page.shot("samples")
    assert page.errors == []


def test_the_operator_sees_every_tenant_the_queue_and_the_gauges(page, world):
    page.sign_in(world["admin"])
    p = page.page
    p.wait_for_selector('[data-kpi="trainer busy"]')
    assert "42%" in p.inner_text('[data-kpi="trainer busy"]')
    assert "17%" in p.inner_text('[data-kpi="KV cache"]')
    shown = set(
        p.eval_on_selector_all(
            ".all-jobs tr[data-job]", "rs => rs.map(r => r.dataset.job)"
        )
    )
    assert {world["job"], world["queued"], world["other"]} <= shown
    queue = p.inner_text(".queue")
    assert world["queued"] in queue and world["other"] in queue
    assert p.get_attribute('[data-chart="ttfs"]', "data-points") is not None
    assert "trainer" in p.inner_text(".tenants")
    assert p.locator(".tenants tr[data-tenant]").count() >= 2
    page.shot("admin")
    assert page.errors == []


def test_a_wrong_key_is_refused_and_forgotten(page):
    page.sign_in("sk-marlaas-not-a-key-000000000000")
    page.page.wait_for_selector("#sign-in-error")
    assert "not accepted" in page.page.inner_text("#sign-in-error")
    assert page.page.evaluate("sessionStorage.getItem('marlaas.apiKey')") is None


def test_a_tenant_key_gets_401_on_the_overview_and_the_page_has_a_csp(svc, world):
    base = svc.api.base_url.removesuffix("/v1")
    for key in (world["key_a"], None):
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        r = httpx.get(f"{base}/v1/admin/overview", headers=headers)
        assert r.status_code == 401, r.text
    ok = httpx.get(
        f"{base}/v1/admin/overview",
        headers={"Authorization": f"Bearer {world['admin']}"},
    )
    assert ok.status_code == 200 and ok.json()["trainer_busy_fraction"] == 0.42
    page = httpx.get(f"{base}/dashboard")
    assert page.status_code == 200
    csp = page.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "connect-src 'self'" in csp
    assert httpx.get(f"{base}/dashboard/assets/index.html").status_code == 404
    assert httpx.get(f"{base}/dashboard/assets/..%2F__init__.py").status_code == 404


def examples_job(svc, client, kind: str, scores: dict) -> str:
    """A running supervised or DPO job of ``client`` with two committed steps
    (records as the runtime writes them)."""
    row = (
        {
            "input": {"messages": [{"role": "user", "content": "Say hi."}]},
            "preferred_output": [{"role": "assistant", "content": "hi"}],
            "non_preferred_output": [{"role": "assistant", "content": "no"}],
        }
        if kind == "dpo"
        else {
            "messages": [
                {"role": "user", "content": "Say hi."},
                {"role": "assistant", "content": "hi"},
            ]
        }
    )
    f = client.files.create(
        file=("x.jsonl", (json.dumps(row) + "\n").encode() * 4), purpose="fine-tune"
    )
    method = {"type": kind, kind: {"hyperparameters": {"batch_size": 2}}}
    job = client.fine_tuning.jobs.create(
        model="SmolLM2-135M-Instruct", training_file=f.id, method=method
    )
    for status in (VALIDATING, QUEUED, RUNNING):
        svc.store.set_status(job.id, status)
    part = "supervised" if kind == "supervised" else "preference"
    for step in (1, 2):
        r = step_record(step, reward=0.0, t=time.time())
        r.update(reward_mean=None, graders=[], loss=1.0 / step)  # type: ignore[typeddict-item]
        r[part] = {k: v / step for k, v in scores.items()}  # type: ignore[literal-required]
        data = step_metrics.step_data(r, 2)
        svc.store.record_step(job.id, step, data, at=time.time())
        folder = svc.cfg.root_dir / "adapters" / job.id / str(step)
        folder.mkdir(parents=True, exist_ok=True)
        svc.store.record_checkpoint(
            job.id, step, step, folder, step_metrics.checkpoint_metrics(data)
        )
    return job.id


@pytest.mark.parametrize(
    ("kind", "scores", "charts"),
    [
        (
            "supervised",
            {"train_mean_token_accuracy": 0.5, "trained_tokens": 8, "valid_loss": 1.2},
            {
                "loss": "train|validation|full validation",
                "token-accuracy": "train|validation|full validation",
                "timing": "sampling|training|eval|full iteration",
            },
        ),
        (
            "dpo",
            {
                "train_preference_accuracy": 0.5,
                "train_reward_margin": 0.1,
                "trained_pairs": 2,
            },
            {
                "loss": "train|validation|full validation",
                "preference-accuracy": "train|validation|full validation",
                "reward-margin": "train|validation",
                "timing": "sampling|training|eval|full iteration",
            },
        ),
    ],
)
def test_a_supervised_or_dpo_job_page_charts_its_methods_scores(
    page, svc, kind, scores, charts
):
    _, key, client = svc.tenant(kind[:3])
    job_id = examples_job(svc, client, kind, scores)

    page.sign_in(key, f"#/jobs/{job_id}")

    p = page.page
    p.wait_for_selector('[data-chart="loss"][data-points="2"]')
    shown = p.eval_on_selector_all(
        "[data-chart]", "cs => cs.map(c => [c.dataset.chart, c.dataset.series])"
    )
    assert dict(shown) == charts
    header = p.inner_text(".checkpoints tr")
    assert "train loss" in header and "reward" not in header
    assert p.locator(".checkpoints tr[data-step]").count() == 2
    assert page.errors == []
