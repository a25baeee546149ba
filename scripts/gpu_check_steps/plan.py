"""The GPU check's plan: its steps in order, each with its time budget, and the
internal steps gpu_check.py runs as its own subprocesses."""

from __future__ import annotations

from gpu_check_steps.common import Step, internal
from gpu_check_steps.cuda_steps import (
    post_bench,
    post_quickstart,
    post_rollout,
    preview_needs,
    step_bench,
    step_logprob,
    step_quickstart,
    step_rollout,
    step_trainer_cuda,
)
from gpu_check_steps.environment import need_gpu, need_model, need_trainer, need_vllm
from gpu_check_steps.prepare import (
    internal_build,
    internal_setup,
    post_model,
    post_setup,
    preview_build,
    preview_model,
    step_build,
    step_model,
)

# Budgets (seconds). Their sum over in-deadline steps (540) must fit the deadline
# (default 570: 30 s for the process starts and report writes between steps).
BUDGETS: dict[str, float] = {
    "build": 1800.0,  # outside the deadline: only runs when something is missing
    "setup": 60.0,
    "model": 60.0,
    "trainer_cuda": 95.0,
    "rollout_multilora": 60.0,
    "logprob_agreement": 85.0,
    "quickstart": 60.0,
    "bench": 120.0,
}


def make_steps() -> list[Step]:
    B = BUDGETS
    return [
        Step(
            "build",
            B["build"],
            "build what is missing and buildable: AReaL venv, vLLM CUDA venv, the "
            "bf16 default model (cached under $MARLAAS_CACHE)",
            step_build,
            preview_build,
            in_deadline=False,
        ),
        Step(
            "setup",
            B["setup"],
            "machine facts; pick the trainer and vLLM interpreters and check that "
            "they import; install a --wheelhouse for this python3",
            lambda ctx: internal(ctx, "setup"),
            lambda ctx: ("run", "probe interpreters and imports"),
            post_setup,
        ),
        Step(
            "model",
            B["model"],
            "bf16 model: the real SmolLM2-135M-Instruct if cached/preparable, else a "
            "random SmolLM2-shaped one; tiny Llama/Qwen3 models",
            step_model,
            preview_model,
            post_model,
        ),
        Step(
            "trainer_cuda",
            B["trainer_cuda"],
            "the FSDP trainer on CUDA without vLLM: packed-attention parity, LoRA slot "
            "swap, step time bf16 vs float32, trained-adapter logprobs vs PEFT, "
            "seeded repeatability",
            step_trainer_cuda,
            preview_needs(need_gpu, need_trainer, need_model),
        ),
        Step(
            "rollout_multilora",
            B["rollout_multilora"],
            "pytest tests/e2e/test_rollout_multilora.py on a bf16 CUDA vLLM server",
            step_rollout,
            preview_needs(need_gpu, need_trainer, need_vllm, need_model),
            post_rollout,
        ),
        Step(
            "logprob_agreement",
            B["logprob_agreement"],
            "vLLM vs trainer logprobs of a GRPO-trained adapter (bf16 and float32), "
            "adapter hot-swap time",
            step_logprob,
            preview_needs(need_gpu, need_trainer, need_vllm, need_model),
        ),
        Step(
            "quickstart",
            B["quickstart"],
            "marlaas train --config configs/quickstart.yaml (3 tasks, bf16, CUDA)",
            step_quickstart,
            preview_needs(need_gpu, need_trainer, need_vllm, need_model),
            post_quickstart,
        ),
        Step(
            "bench",
            B["bench"],
            "marlaas bench: 8 tenants, async vs sync vs sequential",
            step_bench,
            preview_needs(need_gpu, need_trainer, need_vllm, need_model),
            post_bench,
        ),
    ]


INTERNAL = {"setup": internal_setup, "build": internal_build}
