"""The same multi-LoRA rollout through AReaL's single-controller LocalScheduler."""

from __future__ import annotations

import pytest
from areal.api.cli_args import GenerationHyperparameters
from areal.api.io_struct import LocalInfServerInfo
from areal.infra.rpc.rtensor import RTensor
from areal.infra.scheduler.local import LocalScheduler

from areal_marlaas.config import load_config
from areal_marlaas.rollout.controller import MultiTaskRolloutController
from areal_marlaas.rollout.engine import MultiLoRAvLLMEngine
from areal_marlaas.tasks.arithmetic import make_arithmetic_rows
from tests.support.paths import REPO
from tests.support.snapshots import ok, trajectory_summary

pytestmark = pytest.mark.vllm

WORKFLOW = "areal_marlaas.workflows.rlvr.MultiTaskRLVRWorkflow"


def test_local_scheduler_controller_routes_and_publishes_per_task(
    tmp_path, vllm_server, distinct_adapters, model_path
):
    (tmp_path / "nr").mkdir()
    cfg, _ = load_config(
        [
            "--config",
            str(REPO / "configs" / "quickstart.yaml"),
            f"cluster.fileroot={tmp_path}",
            f"cluster.name_resolve.nfs_record_root={tmp_path / 'nr'}",
            "rollout.scheduling_spec.0.cpu=1",
            "rollout.scheduling_spec.0.mem=4",
        ]
    )
    host, port = vllm_server.address.split(":")
    scheduler = LocalScheduler(exp_config=cfg, startup_timeout=120)
    ctrl = MultiLoRAvLLMEngine.as_controller(cfg.rollout, scheduler)
    assert isinstance(ctrl, MultiTaskRolloutController)
    ctrl.initialize(
        role="rollout",
        server_infos=[LocalInfServerInfo(host=host, port=int(port), process=None)],
    )
    try:
        ctrl.register_task("s_a", 0, distinct_adapters[0])
        ctrl.register_task("s_b", 0, distinct_adapters[1])
        rows = make_arithmetic_rows("addition", 3, 1, seed=0)
        kwargs = dict(
            task="s_a",
            reward_fn="areal_marlaas.tasks.rewards.numeric_answer_reward_fn",
            gconfig=GenerationHyperparameters(max_new_tokens=16),
            tokenizer=str(model_path),
        )

        before = ctrl.rollout_task(rows, WORKFLOW, kwargs, group_size=2)
        ctrl.publish("s_a", 1, distinct_adapters[2])
        after = ctrl.rollout_task(rows, WORKFLOW, kwargs, group_size=2)

        assert ctrl.task_version("s_a") == 1 and ctrl.task_version("s_b") == 0
        for trajs, version in ((before, 0), (after, 1)):
            assert len(trajs) == 3 and all(ok(t) for t in trajs)
            for traj in trajs:
                # Tensors stay on the rollout worker until fetched (AReaL RTensors).
                assert isinstance(traj["input_ids"], RTensor)
                summary = trajectory_summary(RTensor.localize(traj))
                assert summary["task"] == "s_a"
                assert all(s["versions"] == [version] for s in summary["samples"])
    finally:
        ctrl.destroy()
        scheduler.delete_workers(None)
