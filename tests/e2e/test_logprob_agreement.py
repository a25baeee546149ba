"""PPO's old logprobs come from vLLM: they must match what the trainer computes for
the same tokens under the same adapter and temperature."""

from __future__ import annotations

import pytest
import torch
from areal.api.cli_args import GenerationHyperparameters, InferenceEngineConfig
from areal.api.io_struct import FinetuneSpec

from areal_marlaas.config import load_config
from areal_marlaas.rollout.engine import MultiLoRAvLLMEngine
from areal_marlaas.tasks.arithmetic import make_arithmetic_rows
from areal_marlaas.train.engine import MultiLoRAFSDPPPOActor
from tests.support.paths import REPO

pytestmark = pytest.mark.vllm

TEMPERATURE = 0.7
# Server and trainer both compute in float32 (the defaults); on SmolLM2 at T=0.7
# the per-token logprobs then agree to < 1e-4 on average (with a bf16 server:
# 0.035). A temperature mismatch (vLLM's default raw_logprobs) gives ~0.3: the
# control below.
MEAN_ABS_TOL = 1e-3


@pytest.fixture(scope="module")
def engines(single_rank_env, vllm_server):
    """One trainer for the module's checks (each on its own task), and a
    rollout engine on the session's server."""
    cfg, _ = load_config(["--config", str(REPO / "configs" / "quickstart.yaml")])
    trainer = MultiLoRAFSDPPPOActor(cfg.actor)
    trainer.create_process_group()
    trainer.initialize(None, FinetuneSpec(1, 1, 1))
    rollout = MultiLoRAvLLMEngine(
        InferenceEngineConfig(
            experiment_name="test", trial_name="lp", backend="vllm:d1", use_lora=True
        )
    )
    rollout.initialize(addr=vllm_server.address, train_data_parallel_size=1)
    yield cfg, trainer, rollout
    rollout.destroy()
    trainer.destroy()


def _batch(rollout, task, model_path, seed):
    return rollout.rollout_task(
        make_arithmetic_rows("multiplication", 4, 1, seed=seed),
        "areal_marlaas.workflows.rlvr.MultiTaskRLVRWorkflow",
        dict(
            task=task,
            reward_fn="areal_marlaas.tasks.rewards.numeric_answer_reward_fn",
            gconfig=GenerationHyperparameters(
                max_new_tokens=24, temperature=TEMPERATURE
            ),
            tokenizer=str(model_path),
        ),
        group_size=2,
    )


def test_vllm_logprobs_match_trainer_at_sampling_temperature(
    tmp_path, engines, model_path
):
    _, trainer, rollout = engines
    trainer.add_task("lp", lr=1e-4, total_steps=1, n_samples=2, seed=3, temperature=0.7)
    adapter = trainer.save_adapter("lp", tmp_path / "v0")
    rollout.register_task("lp", 0, adapter)
    trajs = _batch(rollout, "lp", model_path, seed=8)
    trainer.switch_task("lp")
    data = [{k: v for k, v in t.items() if torch.is_tensor(v)} for t in trajs]

    tempered = mean_abs_diff(data, trainer.compute_logp(data))
    temperature = trainer.config.temperature
    trainer.config.temperature = 1.0  # what raw, untempered logprobs would be
    try:
        untempered = mean_abs_diff(data, trainer.compute_logp(data))
    finally:
        trainer.config.temperature = temperature

    print(f"mean |vLLM - trainer| tempered {tempered:.2e} untempered {untempered:.4f}")
    assert tempered < MEAN_ABS_TOL
    assert untempered > 2 * tempered


def mean_abs_diff(data, recomputed) -> float:
    diffs = []
    for traj, logp in zip(data, recomputed, strict=False):
        mask = traj["loss_mask"].bool()
        # vLLM's logprob of token i sits at i; the trainer's at i - 1.
        vllm = traj["logprobs"][mask]
        mine = torch.roll(logp, shifts=1, dims=-1)[mask]
        diffs.append((vllm - mine).abs())
    diffs = torch.cat(diffs)
    assert diffs.numel() > 50
    return float(diffs.mean())


def test_trained_adapter_agrees_and_other_weights_are_refused(
    engines, model_path, distinct_adapters
):
    """A trained adapter (non-zero B on every linear layer, served through our
    CPU LoRA kernels) gives the trainer's logprobs; the same name serving other
    weights is caught by the per-step audit and the step is refused."""
    from areal_marlaas.train.engine import AuditError

    cfg, trainer, rollout = engines
    limit = cfg.audit.limit(cfg.vllm.dtype, cfg.actor.dtype)
    trained, other = distinct_adapters[0], distinct_adapters[1]
    for task in ("good", "swapped"):
        trainer.add_task(
            task,
            lr=1e-4,
            total_steps=2,
            n_samples=2,
            seed=1,
            temperature=TEMPERATURE,
            init_adapter=trained,
            audit_trajectories=4,
            audit_max_mean_gap=limit,
        )
    rollout.register_task("good", 0, trained)
    # The server serves another adapter's weights under swapped-v0.
    rollout.register_task("swapped", 0, other)
    good = _batch(rollout, "good", model_path, seed=9)
    bad = _batch(rollout, "swapped", model_path, seed=9)

    result = trainer.train_task("good", good)
    audit = result["audit"]
    print(
        f"trained adapter: logprob gap mean {audit['logprob_gap_mean']:.2e} max "
        f"{audit['logprob_gap_max']:.2e} over {audit['audited_tokens']} tokens"
    )
    assert result["version"] == 1 and audit["audited_tokens"] > 50
    assert audit["logprob_gap_mean"] < limit / 10
    assert audit["served_adapters"] == ["good-v0"]

    with pytest.raises(AuditError, match="did not generate with swapped-v0") as err:
        trainer.train_task("swapped", bad)
    print(f"swapped weights: {err.value}")
    assert trainer.slots["swapped"].version == 0  # the step was not applied
