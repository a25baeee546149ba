"""The job service live: ``marlaas service`` as a user starts it (the real
trainer workers, the real HTTP API, the real vLLM server: the session's),
driven only through the official ``openai`` SDK (operators add tenants with
``marlaas service tenant add``). One service serves every test of this module,
each with tenants of its own, as a service serves tenants; its store is
PostgreSQL, with the concurrent writers of several jobs and two trainer
workers. Slow: ``make test-live``."""

from __future__ import annotations

import io
import signal
import tarfile
import time

import httpx
import openai
import pytest
from sqlalchemy import create_engine as make_engine
from sqlalchemy import text

from areal_marlaas.bench.echo_task import prompt as echo_prompt
from areal_marlaas.bench.echo_task import write_echo_data
from areal_marlaas.rundir.reader import read_jsonl
from areal_marlaas.service.step_metrics import DPO_SCORES as DPO_FIELDS
from areal_marlaas.service.step_metrics import SUPERVISED_SCORES as SUPERVISED_FIELDS
from areal_marlaas.service.store import task_name_of
from tests.support import postgres as pg
from tests.support.dashboard import DashboardPage, chromium
from tests.support.service_live import (
    BASE,
    MULTI,
    STRING_CHECK,
    LiveService,
    kv_of_one_batch,
    lines,
    method,
    wait_all,
)

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

SHAPE = [
    "service.max_new_tokens=16",
    "service.max_prompt_tokens=96",
    "service.max_running_jobs=4",
    "service.poll_interval_s=0.3",
]


@pytest.fixture(scope="module")
def database(postgres) -> str:
    """The module service's store: a new database on the session's PostgreSQL."""
    return pg.fresh_database(postgres)


@pytest.fixture(scope="module")
def service(tmp_path_factory, vllm_server, database):
    """The module's service: two trainer workers on AReaL's LocalScheduler,
    attached to the session's vLLM server, its store on PostgreSQL, and a KV
    budget that holds one rollout batch (2 prompts x 2 samples) at a time, so
    that a job arriving while another rolls out waits ``queued``."""
    budget = int(kv_of_one_batch(SHAPE) * 1.5)
    live = LiveService(
        tmp_path_factory.mktemp("svc"),
        [
            *SHAPE,
            "scheduler.type=local",
            "scheduler.trainers=2",
            f"scheduler.kv_budget_bytes={budget}",
            # Quoted: the URL's query (?host=...&port=...) holds '=' signs.
            f"service.db_url='{database}'",
        ],
        vllm=vllm_server.address,
    )
    live.start()
    yield live
    live.stop()  # unless the module's last test stopped it


def all_events(client, job_id: str, limit: int) -> list:
    """Page through the events with after/limit, checking the pages."""
    out, after = [], None
    while True:
        page = client.fine_tuning.jobs.list_events(
            job_id, limit=limit, **({"after": after} if after else {})
        )
        assert len(page.data) <= limit
        out += page.data
        if not page.has_more:
            return out
        after = page.data[-1].id


def test_tenants_jobs_chat_results_isolation_cancel_and_queueing(service, tmp_path):
    live = service
    a = live.add_tenant("acme")
    b = live.add_tenant("bravo")
    with live.on_failure():
        fa = a.files.create(file=("a.jsonl", lines(4, 1)), purpose="fine-tune")
        fb = b.files.create(file=("b.jsonl", lines(4, 2)), purpose="fine-tune")
        # graders.validate refuses a broken grader naming the field.
        bad = dict(MULTI, calculate_output="exact +* close")
        with pytest.raises(openai.BadRequestError) as err:
            a.fine_tuning.alpha.graders.validate(grader=bad)
        assert err.value.body["param"].endswith("calculate_output")
        ok = a.fine_tuning.alpha.graders.run(
            grader=MULTI, model_sample="The answer is 7.", item={"answer": "7"}
        )
        assert ok.reward == pytest.approx(1.0)

        j1 = a.fine_tuning.jobs.create(
            model=BASE,
            training_file=fa.id,
            method=method(STRING_CHECK, learning_rate_multiplier=20),
            metadata={"team": "one"},
        )
        j2 = a.fine_tuning.jobs.create(
            model=BASE, training_file=fa.id, method=method(MULTI)
        )
        j_cancel = a.fine_tuning.jobs.create(
            model=BASE, training_file=fa.id, method=method(STRING_CHECK, n_epochs=3)
        )
        j3 = b.fine_tuning.jobs.create(
            model=BASE, training_file=fb.id, method=method(STRING_CHECK)
        )
        seen: dict[str, list[str]] = {}
        # Cancel the 3-epoch job once it committed a step.
        deadline = time.monotonic() + 900
        while a.fine_tuning.jobs.retrieve(j_cancel.id).status != "running" or not (
            a.fine_tuning.jobs.checkpoints.list(j_cancel.id).data
        ):
            assert time.monotonic() < deadline, live.tail()
            time.sleep(1)
        a.fine_tuning.jobs.cancel(j_cancel.id)

        ids = [j1.id, j2.id, j_cancel.id]
        done = wait_all(a, ids, 1500, seen) | wait_all(b, [j3.id], 600, seen)

        assert done[j_cancel.id].status == "cancelled", live.tail()
        for j in (j1.id, j2.id, j3.id):
            assert done[j].status == "succeeded", (j, done[j], live.tail())
            assert done[j].fine_tuned_model and done[j].result_files

        # Queueing: some job was held by the KV budget while `queued`, then ran.
        held = []
        for j in (j1.id, j2.id, j_cancel.id, j3.id):
            client = b if j == j3.id else a
            msgs = [e.message for e in reversed(all_events(client, j, limit=3))]
            wait = [i for i, m in enumerate(msgs) if m.startswith("Waiting to start")]
            start = [i for i, m in enumerate(msgs) if m == "Fine-tuning job started"]
            queued = [i for i, m in enumerate(msgs) if "moving job to queued" in m]
            if wait:
                # queued -> held by the KV budget -> started once a slot freed
                assert queued and start and queued[0] < wait[0] < start[0], msgs
                held.append(j)
        assert held, "no job ever waited for the KV budget"

        # Events page with after/limit; one checkpoint per committed step.
        events = all_events(a, j1.id, limit=3)
        full = a.fine_tuning.jobs.list_events(j1.id, limit=100).data
        assert [e.id for e in events] == [e.id for e in full]
        assert len({e.id for e in events}) == len(events) > 6
        for j, client in ((j1.id, a), (j2.id, a), (j3.id, b)):
            ckpts = client.fine_tuning.jobs.checkpoints.list(j, limit=100).data
            steps = sorted(c.step_number for c in ckpts)
            job = done[j]
            assert steps == list(range(1, job.steps_done + 1)), steps  # type: ignore[attr-defined]
            assert job.steps_done == 2  # type: ignore[attr-defined]
        # TTFS (created -> first committed step), per job, in the job object.
        ttfs = {j: done[j].ttfs_s for j in (j1.id, j2.id, j3.id)}  # type: ignore[attr-defined]
        print(f"ttfs_s per job: {ttfs}")
        assert all(t is not None and 0 < t < 1500 for t in ttfs.values()), ttfs
        cancelled_ckpts = a.fine_tuning.jobs.checkpoints.list(j_cancel.id).data
        assert 1 <= len(cancelled_ckpts) < 6  # stopped early

        # The tenant's model answers, from its adapter. j2's job: its graded
        # reward is continuous (text_similarity), so its steps move the adapter;
        # j1's 0/1 string_check can give every sample of a group the same reward
        # (zero advantage, zero update: seen once, base == tuned).
        ft = done[j2.id].fine_tuned_model
        prompt = [{"role": "user", "content": "What is 3 + 4? Reply briefly."}]

        def lp(model):
            r = a.chat.completions.create(
                model=model,
                messages=prompt,
                max_tokens=6,
                temperature=0,
                logprobs=True,
            )
            assert r.model == model and r.choices[0].message.content
            return [t.logprob for t in r.choices[0].logprobs.content]

        tuned, base = lp(ft), lp(BASE)
        assert max(abs(x - y) for x, y in zip(tuned, base, strict=False)) > 1e-4, (
            tuned,
            base,
        )
        assert {m.id for m in a.models.list().data} >= {BASE, ft}

        # The result file is the final PEFT adapter; stock PEFT loads it.
        body = a.files.content(done[j2.id].result_files[0]).read()
        out = tmp_path / "adapter"
        with tarfile.open(fileobj=io.BytesIO(body)) as tar:
            tar.extractall(out, filter="data")
        from peft import PeftModel
        from transformers import AutoModelForCausalLM

        from areal_marlaas.paths import default_model_path

        base_model = AutoModelForCausalLM.from_pretrained(str(default_model_path()))
        peft = PeftModel.from_pretrained(base_model, str(out))
        assert any(
            "lora_B" in n and p.abs().sum() > 0 for n, p in peft.named_parameters()
        )

        # Tenant B sees none of A's objects: 404s, never content.
        for call in (
            lambda: b.fine_tuning.jobs.retrieve(j1.id),
            lambda: b.files.retrieve(fa.id),
            lambda: b.files.content(fa.id),
            lambda: b.fine_tuning.jobs.checkpoints.list(j1.id),
            lambda: b.fine_tuning.jobs.list_events(j1.id),
            lambda: b.chat.completions.create(model=ft, messages=prompt, max_tokens=2),
        ):
            with pytest.raises(openai.NotFoundError):
                call()
        assert ft not in {m.id for m in b.models.list().data}
        assert [j.id for j in a.fine_tuning.jobs.list(metadata={"team": "one"})] == [
            j1.id
        ]
    print({j: s for j, s in seen.items()})


def test_validation_evals_metrics_and_best_checkpoints(service):
    """A job with a validation file evaluated after every step, through the SDK:
    one metrics event per step in OpenAI's shape whose validation mean is its
    eval run's, per sub-grader scores, the newest and best 3 checkpoints kept,
    and the eval hidden from another tenant."""
    live = service
    a, b = live.add_tenant("acme"), live.add_tenant("bravo")
    admin = live.admin_key()
    with live.on_failure(), chromium() as browser:
        train = a.files.create(file=("t.jsonl", lines(10, 5)), purpose="fine-tune")
        valid = a.files.create(file=("v.jsonl", lines(3, 6)), purpose="fine-tune")
        j = a.fine_tuning.jobs.create(
            model=BASE,
            training_file=train.id,
            validation_file=valid.id,
            method=method(MULTI, eval_interval=1, eval_samples=3),
        )
        # The dashboard, open on the job from its start and never reloaded.
        dash = DashboardPage(browser, f"http://127.0.0.1:{live.port}")
        dash.sign_in(a.api_key, f"#/jobs/{j.id}")
        dash.page.wait_for_selector('[data-chart="reward"]')
        dash.page.evaluate("window.sameDocument = true")
        job = wait_all(a, [j.id], 1500)[j.id]
        assert job.status == "succeeded", live.tail()
        steps = job.steps_done  # type: ignore[attr-defined]
        assert steps == 5
        eval_id = job.eval_id  # type: ignore[attr-defined]
        assert eval_id and a.evals.retrieve(eval_id).id == eval_id
        criteria = a.evals.retrieve(eval_id).testing_criteria
        assert sorted(c.name for c in criteria) == ["close", "exact"]

        metrics = [e for e in all_events(a, j.id, 50) if e.type == "metrics"]
        by_step = {e.data["step"]: e.data for e in metrics}
        assert sorted(e.data["step"] for e in metrics) == list(range(1, steps + 1))
        runs = {r.step: r for r in a.evals.runs.list(eval_id, limit=100).data}  # type: ignore[attr-defined]
        assert sorted(runs) == list(range(1, steps + 1))
        for step, data in by_step.items():
            items = a.evals.runs.output_items.list(runs[step].id, eval_id=eval_id).data
            assert len(items) == 3
            rewards = [i.reward for i in items]  # type: ignore[attr-defined]
            scores = data["scores"]
            assert scores["valid_reward_mean"] == pytest.approx(sum(rewards) / 3)
            assert {g["name"] for g in scores["graders"]} == {"exact", "close"}
            assert all(
                "train_reward_mean" in g and "valid_reward_mean" in g
                for g in scores["graders"]
            )
            assert set(data["timing"]["step"]) == {
                "sampling",
                "training",
                "eval",
                "full_iteration",
            }
            assert data["timing"]["step"]["eval"] > 0
            assert {g["name"] for g in data["errors"]["graders"]} == {"exact", "close"}
            item = items[0]
            assert item.sample.output[0].content is not None
            assert {r.name for r in item.results} == {"exact", "close"}
        msg = next(e.message for e in metrics if e.data["step"] == steps)
        assert msg.startswith(f"Step {steps}/{steps}, train mean reward=")
        assert ", full validation mean reward=" in msg

        # Retention: the newest and the best 3 by valid_reward_mean.
        ranked = sorted(
            by_step, key=lambda s: (by_step[s]["scores"]["valid_reward_mean"], s)
        )
        want = {steps, *ranked[-3:]}
        ckpts = a.fine_tuning.jobs.checkpoints.list(j.id, limit=100).data
        assert {c.step_number for c in ckpts} == want
        for c in ckpts:
            assert c.metrics.valid_reward_mean == pytest.approx(  # type: ignore[attr-defined]
                by_step[c.step_number]["scores"]["valid_reward_mean"]
            )
        dropped = sorted(set(range(1, steps + 1)) - want)
        assert dropped
        gone = f"{job.fine_tuned_model}:ckpt-step-{dropped[0]}"
        with pytest.raises(openai.NotFoundError):
            a.chat.completions.create(
                model=gone, messages=[{"role": "user", "content": "1+1"}], max_tokens=2
            )
        kept = next(c.fine_tuned_model_checkpoint for c in ckpts)
        out = a.chat.completions.create(
            model=kept, messages=[{"role": "user", "content": "1+1"}], max_tokens=2
        )
        assert out.choices[0].message is not None

        # Another tenant sees none of it.
        with pytest.raises(openai.NotFoundError):
            b.evals.retrieve(eval_id)
        with pytest.raises(openai.NotFoundError):
            b.evals.runs.list(eval_id)
        with pytest.raises(openai.NotFoundError):
            b.evals.runs.output_items.list(runs[1].id, eval_id=eval_id)
        assert b.evals.list().data == []

        # The page followed the job as it ran: every step charted, the newest
        # run's samples shown, in the document opened at the start.
        p = dash.page
        p.wait_for_selector(f'[data-chart="reward"][data-points="{steps}"]')
        p.wait_for_selector('.samples[data-items="3"]')
        assert p.evaluate("window.sameDocument") is True
        assert p.get_attribute('[data-chart="graders"]', "data-series") == (
            "exact train|exact valid|close train|close valid"
        )
        assert p.locator(".checkpoints tr[data-step]").count() == len(want)
        dash.shot("dashboard-job")
        assert dash.errors == []
        dash.close()
        ops = DashboardPage(browser, f"http://127.0.0.1:{live.port}")
        ops.sign_in(admin.strip())
        ops.page.wait_for_selector(f'.all-jobs tr[data-job="{j.id}"]')
        # Every job of the service with a first step so far is charted.
        ops.page.wait_for_selector('[data-chart="ttfs"]:not([data-points="0"])')
        ops.shot("dashboard-admin")
        assert ops.errors == []
        ops.close()


TENANTS = {"acme": 2, "globex": 1}  # jobs each


def test_supervised_and_dpo_jobs_beside_a_reinforcement_job_and_continued(
    service, tmp_path
):
    """A supervised job (OpenAI's chat format, a validation file), a DPO job
    (preference pairs) and a reinforcement job of one tenant on one service:
    all succeed; the supervised and DPO steps go through the one train queue
    while the reinforcement job rolls out; their metrics events and
    checkpoints carry OpenAI's loss fields (token accuracy; preference
    accuracy); their models answer chat. A supervised job continuing the
    first one's model starts from its adapter: its first training loss on the
    first job's validation file is that job's last full validation loss.
    Another tenant naming that model gets a 404."""
    live = service
    a, b = live.add_tenant("sfta"), live.add_tenant("sftb")
    echo = write_echo_data(tmp_path / "echo", train=8, valid=4, test=1)
    pref = write_echo_data(tmp_path / "pref", 8, 4, 1, seed=1, preference=True)

    def upload(client, path):
        return client.files.create(
            file=(path.name, path.read_bytes()), purpose="fine-tune"
        )

    def examples(kind, **hp):
        hp = {"batch_size": 4, "n_epochs": 2, **hp}
        return {"type": kind, kind: {"hyperparameters": hp}}

    with live.on_failure():
        valid = upload(a, echo["valid"])
        prompts = a.files.create(file=("rl.jsonl", lines(4, 7)), purpose="fine-tune")
        rl = a.fine_tuning.jobs.create(
            model=BASE,
            training_file=prompts.id,
            method=method(STRING_CHECK, n_epochs=3),
        )
        sft = a.fine_tuning.jobs.create(
            model=BASE,
            training_file=upload(a, echo["train"]).id,
            validation_file=valid.id,
            method=examples("supervised"),  # type: ignore[arg-type]
        )
        dpo = a.fine_tuning.jobs.create(
            model=BASE,
            training_file=upload(a, pref["train"]).id,
            validation_file=upload(a, pref["valid"]).id,
            method=examples("dpo", beta=0.1),  # type: ignore[arg-type]
        )
        done = wait_all(a, [rl.id, sft.id, dpo.id], 1200)
        assert {j.status for j in done.values()} == {"succeeded"}, done
        model = done[sft.id].fine_tuned_model
        # Continued: the first job's validation file, all of it in one step.
        more = a.fine_tuning.jobs.create(
            model=model,
            training_file=valid.id,
            method=examples("supervised", n_epochs=1),  # type: ignore[arg-type]
        )
        with pytest.raises(openai.NotFoundError) as other:
            b.fine_tuning.jobs.create(
                model=model,
                training_file=upload(b, echo["valid"]).id,
                method=examples("supervised"),  # type: ignore[arg-type]
            )
        done |= wait_all(a, [more.id], 600)
        assert done[more.id].status == "succeeded", done[more.id]

        def metrics(job_id):
            events = reversed(all_events(a, job_id, 20))
            return [e for e in events if e.type == "metrics"]

        runs = {j: metrics(j) for j in (sft.id, dpo.id, more.id)}
        ckpts = {
            j: a.fine_tuning.jobs.checkpoints.list(j, limit=100).data
            for j in (sft.id, dpo.id)
        }
        word = echo["test"].read_text().split('"content": "Say ')[1].split(" ")[0]
        ask = [{"role": "user", "content": echo_prompt(word)}]

        def lp(m):
            r = a.chat.completions.create(
                model=m, messages=ask, max_tokens=12, temperature=0, logprobs=True
            )
            print(f"{m}: {r.choices[0].message.content!r}")
            return [t.logprob for t in r.choices[0].logprobs.content]

        answers = {j: lp(done[j].fine_tuned_model) for j in (sft.id, dpo.id)}
        base = lp(BASE)
        with pytest.raises(openai.NotFoundError):
            b.chat.completions.create(model=model, messages=ask, max_tokens=2)

    assert other.value.body["param"] == "model"  # type: ignore[index]
    for job_id, fields in ((sft.id, SUPERVISED_FIELDS), (dpo.id, DPO_FIELDS)):
        data = [e.data for e in runs[job_id]]
        assert [d["step"] for d in data] == [1, 2, 3, 4], data
        for d, e in zip(data, runs[job_id], strict=True):
            assert e.message.startswith(f"Step {d['step']}/4: training loss=")
            for key in fields[:4]:
                assert isinstance(d[key], float), (key, d)
        assert {fields[-2], fields[-1]} <= set(data[-1])  # full validation
        # The preferred answers were learned, on held-out words.
        assert data[-1]["valid_loss"] < data[0]["train_loss"], data
        for c in ckpts[job_id]:
            assert c.metrics.train_loss is not None and c.metrics.valid_loss is not None
        last = next(c for c in ckpts[job_id] if c.step_number == 4)
        assert last.metrics.full_valid_loss == pytest.approx(
            data[-1]["full_valid_loss"]
        )
        assert (
            max(abs(x - y) for x, y in zip(answers[job_id], base, strict=False)) > 1e-4
        )
    # The continued job began from the first one's adapter.
    first = runs[more.id][0].data
    assert first["train_loss"] == pytest.approx(
        runs[sft.id][-1].data["full_valid_loss"], abs=1e-4
    )
    # One train queue: the supervised and DPO steps committed while the
    # reinforcement job was between its first and last steps.
    records = read_jsonl(live.run_dir / "steps.jsonl")
    commits = {
        j: [r["t_commit"] for r in records if r["task"] == task_name_of(j)]
        for j in (rl.id, sft.id, dpo.id)
    }
    lo, hi = min(commits[rl.id]), max(commits[rl.id])
    assert any(lo < t < hi for t in commits[sft.id] + commits[dpo.id]), commits


def test_two_tenants_jobs_on_two_trainer_workers_and_their_usage(service):
    """scheduler.trainers=2 on AReaL's LocalScheduler: each job's task is placed
    on one trainer worker when it is handed over and trains only there, and
    every job finishes with every checkpoint. What the API reports of usage
    (each job's ``usage``, the operator's ``/v1/admin/usage`` per tenant) is
    the sum over the run directory's step records, which the trainer writes
    independently of the job database."""
    live = service
    clients = {name: live.add_tenant(name) for name in TENANTS}
    admin = live.admin_key()
    with live.on_failure():
        mine: dict[str, list[str]] = {}
        for i, (name, c) in enumerate(clients.items()):
            for j in range(TENANTS[name]):
                f = c.files.create(
                    file=("a.jsonl", lines(4, 10 * i + j)), purpose="fine-tune"
                )
                job = c.fine_tuning.jobs.create(
                    model=BASE, training_file=f.id, method=method(STRING_CHECK)
                )
                mine.setdefault(name, []).append(job.id)
        done = {name: wait_all(clients[name], ids, 900) for name, ids in mine.items()}
        for name, jobs in done.items():
            for job in jobs.values():
                assert job.status == "succeeded", job
                ckpts = clients[name].fine_tuning.jobs.checkpoints.list(job.id).data
                steps = sorted(x.step_number for x in ckpts)
                assert steps == list(range(1, job.steps_done + 1)) == [1, 2]
        body = httpx.get(
            f"http://127.0.0.1:{live.port}/v1/admin/usage",
            headers={"Authorization": f"Bearer {admin}"},
        ).json()

    tasks = {task_name_of(j) for ids in mine.values() for j in ids}
    records = [
        r for r in read_jsonl(live.run_dir / "steps.jsonl") if r["task"] in tasks
    ]
    placed: dict[str, int] = {}
    for r in records:
        assert placed.setdefault(r["task"], r["trainer"]) == r["trainer"]
    assert set(placed) == tasks and set(placed.values()) == {0, 1}, records
    assert (live.run_dir / "logs" / "actor1.log").is_file()
    tenants = {t["tenant"]: t for t in body["tenants"]}
    for name, jobs in done.items():
        theirs = []
        for job in jobs.values():
            steps = [r for r in records if r["task"] == task_name_of(job.id)]
            assert [r["version"] for r in steps] == [1, 2]
            usage = job.usage  # type: ignore[attr-defined]
            assert usage["trainer_s"] == pytest.approx(sum(r["train_s"] for r in steps))
            tokens = sum(r["trained_tokens"] for r in steps)
            assert tokens > 0
            assert usage["generated_tokens"] == usage["trained_tokens"] == tokens
            theirs += steps
        tenant = tenants[clients[name].tenant]
        assert tenant["jobs"] == TENANTS[name]
        assert tenant["trainer_s"] == pytest.approx(sum(r["train_s"] for r in theirs))
        assert tenant["trained_tokens"] == sum(r["trained_tokens"] for r in theirs)


def test_sigterm_to_the_group_drains_a_running_job_and_exits_cleanly(service, database):
    """Last of the module: the module's service stopped as ``kill -- -PGID``,
    systemd or a container stop do, while a job runs. It drains (the job stops
    at a committed version, for the next start to resume), exits with code 0,
    prints no traceback, leaves no process (its two trainer workers and its
    rollout worker), and has closed its store (no connection to its
    database)."""
    live = service
    a = live.add_tenant("acme")
    f = a.files.create(file=("a.jsonl", lines(8, 7)), purpose="fine-tune")
    job = a.fine_tuning.jobs.create(
        model=BASE, training_file=f.id, method=method(STRING_CHECK)
    )
    with live.on_failure():
        deadline = time.monotonic() + 900
        while not a.fine_tuning.jobs.checkpoints.list(job.id).data:
            assert time.monotonic() < deadline, live.tail()
            time.sleep(0.5)

    code, left = live.signal_group(signal.SIGTERM)

    out = live.output()
    assert code == 0, out[-5000:]
    assert "Traceback" not in out, out[-5000:]
    assert "drained: every job stopped at a committed version" in out
    assert left == [], (left, out[-3000:])
    assert pg.connections(database) == 0
    # Stopped at a committed version: its checkpoints are the trainer's
    # commits, contiguous, and fewer than its 4 steps.
    db = make_engine(database)
    with db.connect() as conn:
        steps = sorted(
            r[0]
            for r in conn.execute(
                text("SELECT step_number FROM checkpoints WHERE job_id = :j"),
                {"j": job.id},
            )
        )
    db.dispose()
    committed = [
        r["version"]
        for r in read_jsonl(live.run_dir / "steps.jsonl")
        if r["task"] == task_name_of(job.id)
    ]
    assert steps == committed == list(range(1, len(steps) + 1)), (steps, committed)
    assert 1 <= len(steps) < 4
