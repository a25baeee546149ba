# Two venvs live in the cache folder ($MARLAAS_CACHE, default ~/.cache/areal-marlaas):
# the AReaL venv (plugin + trainer) and the vLLM venv (rollout server).
CACHE ?= $(or $(MARLAAS_CACHE),$(HOME)/.cache/areal-marlaas)
AREAL_VENV ?= $(or $(MARLAAS_AREAL_VENV),$(CACHE)/venv-areal)
PY := $(AREAL_VENV)/bin/python
CONFIG ?= configs/quickstart.yaml

.PHONY: setup test test-live lint quickstart bench-rollout bench-learning bench bench-service simulate bench-cpu-lora gpu-check gpu-check-dry gpu-check-wheels

setup:
	bash scripts/setup.sh

# The default suite: every test not marked slow (docs/testing.md).
test: setup
	$(PY) -m pytest

# Every slow test, in one pytest session as CI runs them: the session's vLLM
# server, PostgreSQL and job service start once for all of them (docs/testing.md
# lists what they cover and how long they take). LIVE_ARGS narrows the run, e.g.
# LIVE_ARGS=tests/e2e/test_service_e2e.py or LIVE_ARGS="-k two_hosts".
test-live: setup
	RAY_memory_monitor_refresh_ms=0 $(PY) -m pytest -m slow $(LIVE_ARGS)

# ruff (lint + format) and the type checker (pyproject.toml [tool.basedpyright]).
lint: setup
	$(AREAL_VENV)/bin/ruff check . && $(AREAL_VENV)/bin/ruff format --check .
	$(AREAL_VENV)/bin/basedpyright --pythonpath $(PY)

quickstart: setup
	$(AREAL_VENV)/bin/marlaas train --config $(CONFIG)

bench-rollout: setup
	$(AREAL_VENV)/bin/marlaas bench-rollout --config $(CONFIG)

bench-learning: setup
	$(AREAL_VENV)/bin/marlaas bench-learning --config configs/learning.yaml

# Every scheduling mode + ablation + concurrency sweep (extra overrides: BENCH_ARGS);
# results in runs/bench (bench.out).
bench: setup
	$(AREAL_VENV)/bin/marlaas bench --config configs/bench.yaml $(BENCH_ARGS)

# Poisson-arriving jobs at the async vs a FIFO service (extra overrides: BENCH_ARGS);
# results in runs/bench_service (load.out).
bench-service: setup
	$(AREAL_VENV)/bin/marlaas bench-service --config configs/bench_service.yaml $(BENCH_ARGS)

# Simulator fitted to the bench: validation and projection (SIM_ARGS, e.g.
# SIM_ARGS="--tenants 1,32,1000 --rollout-devices 8 --train-devices 8"); fits the
# committed result SIM_BENCH and writes runs/sim/sim.json and .md.
SIM_BENCH ?= docs/results/bench
simulate: setup
	$(AREAL_VENV)/bin/marlaas simulate $(SIM_BENCH) --out runs/sim/sim.json $(SIM_ARGS)

# CPU serving: vLLM's LoRA ops vs our grouped plugin, bf16 vs float32 (~8 min).
bench-cpu-lora: setup
	$(PY) scripts/bench_cpu_lora.py

# GPU check (docs/gpu_check.md): builds what is missing (CUDA venvs, bf16 model;
# cached, outside the deadline), then runs the plugin on CUDA within a global
# deadline (default 570 s); gpu_check.json/.md go to $OUT, else runs/gpu_check
# (committed by hand under docs/results/gpu/). Refused without a GPU: use gpu-check-dry.
# Stdlib-only script: any python3 runs it (GPU_CHECK_ARGS, e.g. --wheelhouse DIR).
GPU_CHECK_PYTHON ?= python3
gpu-check:
	$(GPU_CHECK_PYTHON) scripts/gpu_check.py $(GPU_CHECK_ARGS)

# The same script's plan, budgets and environment checks; no GPU needed (CI).
gpu-check-dry:
	$(GPU_CHECK_PYTHON) scripts/gpu_check.py --dry-run $(GPU_CHECK_ARGS)

# Wheels an offline GPU machine's python3 (3.12) lacks (requirements/gpu-offline.txt).
gpu-check-wheels:
	$(GPU_CHECK_PYTHON) scripts/gpu_check.py --fetch-wheels .gpu-wheels --python-version 3.12
