"""Every AReaL field the multi-task trainer cannot honor is refused by name, and
every PPO field it can is honored, per task too."""

from __future__ import annotations

import dataclasses

import pytest

from areal_marlaas.config import ConfigError, load_config
from areal_marlaas.config.run import _UNUSED_SECTIONS, UNHONORED
from areal_marlaas.config.tasks import TaskPPOConfig
from tests.support.engines import make_engine, ragged_batch
from tests.support.paths import REPO

# The FSDP engine is built in this process, as one rank.
pytestmark = pytest.mark.usefixtures("single_rank_env")

QUICKSTART = ["--config", str(REPO / "configs" / "quickstart.yaml")]

# A value of each refused field that is not allowed (hydra override syntax).
REFUSED = {
    "gconfig": "gconfig.max_new_tokens=99",
    "eval_gconfig": "eval_gconfig={max_new_tokens: 99}",
    "train_dataset": "train_dataset.path=gsm8k",
    "valid_dataset": "valid_dataset={path: x, type: rl}",
    "ref": "ref={path: x}",
    "critic": "critic={path: x}",
    "teacher": "teacher={path: x}",
    "total_train_epochs": "total_train_epochs=3",
    "total_train_steps": "total_train_steps=5",
    "total_train_n_seqs": "total_train_n_seqs=100",
    "dynamic_bs": "dynamic_bs=true",
    "allocation_mode": "allocation_mode=vllm:d1+fsdp:d1",
    "enable_offload": "enable_offload=true",
    "sglang": "sglang.random_seed=7",
    "seed": "seed=7",
    "perf_tracer": "perf_tracer={enabled: true}",
    "memory_profiler": "memory_profiler={enabled: true}",
    "actor.kl_ctl": "actor.kl_ctl=0.1",
    "actor.temperature": "actor.temperature=0.5",
    "actor.max_new_tokens": "actor.max_new_tokens=77",
    "actor.reward_norm": "actor.reward_norm={mean_level: batch}",
    "actor.use_lora": "actor.use_lora=false",
    "actor.weight_update_mode": "actor.weight_update_mode=xccl",
    "rollout.max_head_offpolicyness": "rollout.max_head_offpolicyness=2",
    "rollout.use_lora": "rollout.use_lora=false",
    "rollout.lora_name": "rollout.lora_name=x",
    "rollout.consumer_batch_size": "rollout.consumer_batch_size=8",
    "rollout.pause_grace_period": "rollout.pause_grace_period=1.5",
    "rollout.return_routed_experts": "rollout.return_routed_experts=true",
    "saver.freq_epochs": "saver.freq_epochs=1",
    "saver.freq_steps": "saver.freq_steps=1",
    "saver.freq_secs": "saver.freq_secs=60",
    "evaluator.freq_epochs": "evaluator.freq_epochs=1",
    "evaluator.freq_steps": "evaluator.freq_steps=1",
    "evaluator.freq_secs": "evaluator.freq_secs=60",
    "recover.mode": "recover.mode=auto",
}


def test_the_table_covers_every_refused_field():
    listed = set(_UNUSED_SECTIONS) | {f"{s}.{k}" for s, k in UNHONORED}
    assert listed == set(REFUSED)


@pytest.mark.parametrize("field", sorted(REFUSED))
def test_refused_field_is_named(field, model_path):
    with pytest.raises(ConfigError) as err:
        load_config([*QUICKSTART, REFUSED[field]])
    assert field in str(err.value)
    # Every refusal says what to do instead (the fix after the colon).
    assert ":" in str(err.value)


def test_defaults_and_shipped_values_are_accepted(model_path):
    cfg, _ = load_config(QUICKSTART)
    assert cfg.actor.kl_ctl == 0 and cfg.rollout.max_head_offpolicyness == 0


# PPO fields the actor honors: actor-level value, then the task's own override.
HONORED = {
    "eps_clip": (0.1, 0.3),
    "eps_clip_higher": (0.25, 0.28),
    "c_clip": (3.0, 5.0),
    "ppo_n_minibatches": (2, 1),
    "reward_scaling": (2.0, 0.5),
    "reward_bias": (-0.5, 0.25),
    "reward_clip": (5.0, 2.0),
    "mask_no_eos_with_zero": (True, False),
}


def test_every_task_ppo_field_is_tested():
    assert set(HONORED) == {f.name for f in dataclasses.fields(TaskPPOConfig)}


@pytest.mark.parametrize("field", sorted(HONORED))
def test_honored_field_reaches_each_tasks_actor(field, tiny):  # noqa: F811
    actor_value, task_value = HONORED[field]
    engine = make_engine(tiny["llama"], **{field: actor_value})
    try:
        engine.add_task("inherits", lr=1e-3, total_steps=3, n_samples=2, seed=0)
        engine.add_task(
            "own",
            lr=1e-3,
            total_steps=3,
            n_samples=2,
            seed=1,
            ppo={field: task_value},
        )
        assert getattr(engine.slots["inherits"].actor.config, field) == actor_value
        assert getattr(engine.slots["own"].actor.config, field) == task_value
        # And the step really runs with it.
        engine.train_task("own", [ragged_batch([9, 12, 7, 10], seed=2)])
        assert engine.slots["own"].version == 1
    finally:
        engine.destroy()


def test_task_ppo_override_from_the_yaml(model_path):
    cfg, _ = load_config([*QUICKSTART, "tasks.1.ppo.eps_clip=0.1"])
    assert cfg.tasks[1].ppo.overrides() == {"eps_clip": 0.1}
    assert cfg.tasks[0].ppo.overrides() == {}


def test_bad_task_ppo_value_names_the_task_and_field(model_path):
    with pytest.raises(ConfigError, match=r"task 'mul1': ppo.eps_clip must be > 0"):
        load_config([*QUICKSTART, "tasks.1.ppo.eps_clip=-1"])


def test_engine_refuses_a_kl_term_it_cannot_compute(tiny):  # noqa: F811
    with pytest.raises(ValueError, match="no reference model"):
        make_engine(tiny["llama"], kl_ctl=0.1)


def test_a_loaded_config_validates_again_as_workers_rebuild_it(model_path):
    """AReaL's RPC rebuilds the dataclass from its fields on every worker, after
    AReaL's own __post_init__ filled in derived values (eval_gconfig,
    rollout.lora_name): those must pass the refusal checks too."""
    cfg, _ = load_config(QUICKSTART)
    again = dataclasses.replace(cfg)
    assert again.rollout.lora_name == cfg.rollout.lora_name
    assert again.eval_gconfig == cfg.eval_gconfig
