"""The GPU check's steps (scripts/gpu_check.py runs them; docs/gpu_check.md).

Imported by the runner, standard library only (any python3 >= 3.8):

* ``common``: paths, small helpers and the plan's types (Command, Skip, Step,
  StepResult, Ctx) that the runner, the report and the steps share
* ``environment``: machine facts, the trainer and vLLM interpreters, what a step needs
* ``wheelhouse``: wheels for an offline machine (fetched here, installed there)
* ``prepare``: the build, setup and model steps
* ``cuda_steps``: the steps that run the plugin on the GPU (trainer_cuda,
  rollout_multilora, logprob_agreement, quickstart, bench)
* ``plan``: the steps in order with their budgets

Run as scripts under the interpreter a step picked (not imported by the runner):
``probe.py``, ``models.py``, ``trainer_cuda.py``, ``logprob_gap.py``, and
``offline_stubs/`` (stand-ins for AReaL imports an offline machine lacks).
"""
