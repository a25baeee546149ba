"""Several tenant tasks from a plain research script, with the plugin's pieces used
directly: AReaL config loading, the multi-LoRA rollout engine, the multi-LoRA FSDP
actor and the MARLaaS runtime.

    python examples/multi_task.py --config configs/quickstart.yaml

(`marlaas train` does the same with more bookkeeping; this shows the moving parts.)
"""

from __future__ import annotations

import sys

from areal.api.io_struct import FinetuneSpec
from areal.utils.hf_utils import load_hf_tokenizer

from areal_marlaas.admission import KVModel
from areal_marlaas.config import load_config
from areal_marlaas.rollout.session import RolloutSession
from areal_marlaas.rundir.writer import RunStore
from areal_marlaas.scheduler.runtime import Runtime, RuntimeOptions
from areal_marlaas.train.engine import MultiLoRAFSDPPPOActor
from areal_marlaas.train.pool import TrainerPool
from areal_marlaas.train.stack import add_tenant, single_rank_env


def main(argv: list[str]) -> None:
    cfg, _ = load_config(argv)
    store = RunStore(cfg.run_dir)

    # The trainer: one FSDP rank in this process, one LoRA slot, one state per task.
    single_rank_env()
    actor = MultiLoRAFSDPPPOActor(cfg.actor)
    actor.create_process_group()
    actor.initialize(None, FinetuneSpec(1, sum(t.total_steps for t in cfg.tasks), 1))
    trainer = TrainerPool([actor])  # what the runtime trains through

    # Each tenant: its own LoRA weights, AdamW state and GRPO actor on the trainer,
    # a committed v0 adapter, and its prompts/workflow for the runtime.
    tokenizer = load_hf_tokenizer(cfg.tokenizer_path)
    kv = KVModel.for_config(cfg)
    runs = [add_tenant(trainer, s, store, tokenizer, cfg, kv) for s in cfg.tasks]

    # The shared multi-LoRA server and AReaL's remote vLLM engine (subclassed).
    with RolloutSession(cfg, store.root) as session:
        for spec in cfg.tasks:
            session.engine.register_task(spec.name, 0, store.adapter_dir(spec.name, 0))
        options = RuntimeOptions(mode=cfg.scheduler.mode)
        summary = Runtime(runs, session.engine, trainer, store, options).run()
    trainer.destroy()

    for name, t in summary["tasks"].items():
        rewards = f"{t['reward_first']} -> {t['reward_last']}"
        print(f"{name}: {t['steps']} steps, reward {rewards}")
    print(f"{summary['train_steps_per_hour']:.0f} train steps/h; run dir {store.root}")


if __name__ == "__main__":
    main(sys.argv[1:])
