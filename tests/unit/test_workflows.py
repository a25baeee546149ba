"""How a task's spec picks its workflow and the workflow's arguments: the class
declares them, so a user's subclass keeps what the built-in gets."""

from __future__ import annotations

from areal.api.workflow_api import RolloutWorkflow

from areal_marlaas.config import (
    FaultToleranceConfig,
    SearchConfig,
    TaskDatasetConfig,
    TaskSpec,
)
from areal_marlaas.workflows import RLVR_WORKFLOW, task_workflow
from areal_marlaas.workflows.rlvr import MultiTaskRLVRWorkflow
from areal_marlaas.workflows.search_agent import SearchAgentWorkflow


class MyRLVR(MultiTaskRLVRWorkflow):
    """A tenant's tweak of the built-in workflow."""


class MySearch(SearchAgentWorkflow):
    pass


class Foreign(RolloutWorkflow):
    def __init__(self, **kwargs):
        self.kwargs = kwargs

    async def arun_episode(self, engine, data):
        return None


FAULT = FaultToleranceConfig(deterministic=True, reward_timeout_s=7, reward_workers=3)


def spec(**kw) -> TaskSpec:
    return TaskSpec(name="t", kind="addition", seed=9, **kw)


def test_a_subclass_of_the_rlvr_workflow_keeps_timeouts_and_seeding(model_path):
    task = spec(workflow=f"{__name__}.MyRLVR")
    path, kwargs = task_workflow(task, str(model_path), FAULT)

    assert path == f"{__name__}.MyRLVR"
    assert kwargs["reward_timeout_s"] == 7 and kwargs["reward_workers"] == 3
    assert kwargs["sampling_seed"] == 9
    assert kwargs["task"] == "t" and kwargs["gconfig"].lora_name == "t"
    # The kwargs build the workflow (what AReaL does on the rollout worker).
    wf = MyRLVR(**kwargs)
    assert wf.sampling_seed == 9 and wf.async_reward_fn.timeout_s == 7


def test_the_task_timeout_wins_over_the_default():
    _, kwargs = task_workflow(spec(reward_timeout_s=2.5), "tok", FAULT)

    assert kwargs["reward_timeout_s"] == 2.5


def test_a_subclass_of_the_search_agent_keeps_its_environment(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": 0, "title": "a", "text": "b"}\n')
    task = TaskSpec(
        name="w",
        kind="wiki_search",
        workflow=f"{__name__}.MySearch",
        dataset=TaskDatasetConfig(path=str(tmp_path / "q.jsonl")),
        search=SearchConfig(corpus_path=str(corpus), top_k=2),
    )

    _, kwargs = task_workflow(task, "tok", FAULT)

    assert kwargs["corpus_path"] == str(corpus) and kwargs["top_k"] == 2
    assert kwargs["sampling_seed"] == 1


def test_a_foreign_workflow_gets_the_basics_only():
    task = spec(workflow=f"{__name__}.Foreign")
    path, kwargs = task_workflow(task, "tok", FAULT)

    assert set(kwargs) == {"task", "reward_fn", "gconfig", "tokenizer"}


def test_no_workflow_means_the_rlvr_workflow():
    path, kwargs = task_workflow(spec(), "tok")

    assert path == RLVR_WORKFLOW and "reward_timeout_s" not in kwargs
