"""End to end: the paper's heterogeneous mix (GSM8K, AMC, wiki-search agent) x 1
step through the real vLLM server and the real FSDP engine."""

from __future__ import annotations

import json

import pytest

from areal_marlaas.config import load_config
from areal_marlaas.rundir.reader import read_jsonl
from areal_marlaas.train.trainer import MultiTaskTrainer
from areal_marlaas.workflows.search_agent import SearchAgentWorkflow
from tests.support.paths import REPO, SHARED_DATA

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        not SHARED_DATA.is_dir(), reason=f"no shared data at {SHARED_DATA}"
    ),
]

TASKS = ("gsm8k", "amc", "wiki")


def test_paper_mix_one_step_each_end_to_end(tmp_path, vllm_server, monkeypatch):
    monkeypatch.setenv("MARLAAS_SHARED_DATA", str(SHARED_DATA))
    # Count the agent's episodes and tool calls as they happen.
    outcomes: list[dict] = []
    original = SearchAgentWorkflow.arun_episode

    async def arun_episode(self, engine, data):
        traj = await original(self, engine, data)
        outcomes.append(self.outcomes[-1])
        return traj

    monkeypatch.setattr(SearchAgentWorkflow, "arun_episode", arun_episode)
    overrides = [
        f"cluster.fileroot={tmp_path}",
        "trial_name=e2e",
        f'server.addresses=["{vllm_server.address}"]',
        "scheduler.type=null",
    ]
    for i in range(len(TASKS)):
        overrides += [
            f"tasks.{i}.total_steps=1",
            f"tasks.{i}.batch_size=1",
            f"tasks.{i}.n_samples=2",
            f"tasks.{i}.max_new_tokens={48 if TASKS[i] == 'wiki' else 32}",
        ]
    cfg, _ = load_config(
        ["--config", str(REPO / "configs" / "paper_mix.yaml"), *overrides]
    )
    assert [t.name for t in cfg.tasks] == list(TASKS)

    summary = MultiTaskTrainer(cfg).run()

    run = tmp_path / "marlaas-paper-mix" / "e2e"
    steps = read_jsonl(run / "steps.jsonl")
    for task in TASKS:
        (step,) = [s for s in steps if s["task"] == task]
        assert step["version"] == 1 and step["staleness_max"] == 0
        assert step["n_trajectories"] == 2
        assert 0.0 <= step["reward_mean"] <= 1.0
        t = summary["tasks"][task]
        assert (t["steps"], t["final_version"], t["status"]) == (1, 1, "done")
    # The wiki task ran through the agent: 2 episodes, each ended with a reward
    # and, when it scored 0 without an answer, a reason.
    assert len(outcomes) == 2
    for o in outcomes:
        assert o["answer"] is not None or o["reason"]
    saved = json.loads((run / "summary.json").read_text())
    assert set(saved["tasks"]) == set(TASKS)
