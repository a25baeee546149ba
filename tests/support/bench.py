"""A small ``marlaas bench`` configuration: two arithmetic tasks, eight
replicas."""

BENCH_YAML = """
experiment_name: bench-test
trial_name: t0
tasks:
  - {name: mul1, kind: multiplication, dataset: {digits: 1, size: 100},
     batch_size: 2, n_samples: 2, max_new_tokens: 16, total_steps: 5, seed: 11}
  - {name: add1, kind: addition, dataset: {digits: 1, size: 100},
     batch_size: 2, n_samples: 2, max_new_tokens: 16, total_steps: 5, seed: 3}
bench:
  task: mul1
  replicas: 8
  steps: 3
"""
