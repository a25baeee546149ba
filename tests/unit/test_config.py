"""Config loading, hydra-style overrides and `marlaas check` errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from areal_marlaas.cli import main as marlaas
from areal_marlaas.config import ConfigError, load_config
from tests.support.paths import SHARED_DATA

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted((REPO / "configs").glob("*.yaml"))
# configs/bench.yaml is a train config plus a `bench:` section: `marlaas bench`
# reads it (test_shipped_bench_config_loads), `marlaas check` does not; the
# service's configs (service.yaml and every bench_service*.yaml) are read by
# their own loaders (tests/unit/test_bench_service.py).
TRAIN_CONFIGS = [
    p
    for p in SHIPPED
    if p.stem not in ("bench", "service") and not p.stem.startswith("bench_service")
]


def write(path: Path, data) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def task(name: str, **kw) -> dict:
    return {"name": name, "kind": "addition", "batch_size": 2, "n_samples": 2, **kw}


@pytest.fixture
def main_yaml(tmp_path, model_path) -> Path:
    return write(
        tmp_path / "main.yaml",
        {
            "experiment_name": "cfgtest",
            "trial_name": "t0",
            "cluster": {"fileroot": str(tmp_path / "runs")},
            "actor": {"path": str(model_path), "lora_rank": 8},
            "vllm": {"max_lora_rank": 8, "max_model_len": 1024},
            "server": {"cpu_kvcache_space_gib": 1},
        },
    )


def check(capsys, *argv) -> tuple[int, str]:
    rc = marlaas(["check", *map(str, argv)])
    captured = capsys.readouterr()
    return rc, captured.out + captured.err


@pytest.mark.parametrize("config", TRAIN_CONFIGS, ids=lambda p: p.name)
def test_shipped_config_passes_check(config, capsys, model_path):
    if config.stem == "paper_mix" and not SHARED_DATA.is_dir():
        pytest.skip(f"{config.name} reads the workspace datasets ({SHARED_DATA})")
    rc, out = check(capsys, "--config", config)
    assert rc == 0, out
    assert out.strip().endswith("OK")


def test_overrides_apply_to_task_and_engine_fields(main_yaml, tmp_path):
    tasks = write(tmp_path / "tasks.yaml", {"tasks": [task("t_a"), task("t_b")]})

    cfg, _ = load_config(
        [
            "--config",
            str(main_yaml),
            "--tasks",
            str(tasks),
            "tasks.0.batch_size=8",
            "tasks.1.total_steps=1",
            "tasks.1.dataset.digits=3",
            "vllm.max_loras=2",
            "server.port=9123",
        ]
    )

    assert [t.batch_size for t in cfg.tasks] == [8, 2]
    assert [t.total_steps for t in cfg.tasks] == [10, 1]
    assert cfg.tasks[1].dataset.digits == 3
    assert cfg.vllm.max_loras == 2 and cfg.server.port == 9123
    # Run names flow from the top level into AReaL's nested configs.
    assert cfg.actor.experiment_name == "cfgtest" and cfg.saver.trial_name == "t0"


def test_tasks_file_named_in_yaml_resolves_beside_it(tmp_path, main_yaml):
    write(tmp_path / "tasks.yaml", [task("t_a")])
    data = yaml.safe_load(main_yaml.read_text())
    main = write(tmp_path / "with_tasks.yaml", {**data, "tasks_file": "tasks.yaml"})

    cfg, _ = load_config(["--config", str(main)])

    assert [t.name for t in cfg.tasks] == ["t_a"]


BAD = {
    "duplicate name": ([task("dup"), task("dup")], [], "duplicate task name 'dup'"),
    "unsafe name": ([task("../evil")], [], "task '../evil': name must match"),
    "upper-case name": ([task("Bad")], [], "task 'Bad': name must match"),
    "unknown kind": ([task("t_a", kind="division")], [], "unknown kind 'division'"),
    "missing dataset file": (
        [task("gsm", kind="gsm8k", dataset={"path": "/nonexistent/gsm8k.jsonl"})],
        [],
        "task 'gsm': dataset.path '/nonexistent/gsm8k.jsonl' not found",
    ),
    "gsm8k without path": ([task("gsm", kind="gsm8k")], [], "needs dataset.path"),
    "lora rank differs": (
        [task("t_a"), task("t_b", lora_rank=16)],
        [],
        "tasks.1 ('t_b'): lora_rank=16 differs from the shared LoRA slot",
    ),
    "lora targets differ": (
        [task("t_a", target_modules=["q_proj"])],
        [],
        "tasks.0 ('t_a'): target_modules=['q_proj'] differs",
    ),
    "batch larger than server KV": (
        [task("huge", batch_size=512, n_samples=16)],
        [],
        "tasks.0 ('huge'): batch_size x n_samples = 8192 sequences",
    ),
    "longer than max_model_len": (
        [task("t_a", max_new_tokens=2000)],
        [],
        "exceeds vllm.max_model_len=1024",
    ),
    "group of one": ([task("t_a", n_samples=1)], [], "n_samples must be >= 2"),
    "misspelt field": ([task("t_a", bach_size=3)], [], "Key 'bach_size' not in"),
    "misspelt override": (
        [task("t_a")],
        ["tasks.0.bach_size=3"],
        "unknown field 'tasks[0].bach_size': no such setting; check the spelling. "
        "(task 't_a')",
    ),
    "bad override value": (
        [task("t_a")],
        ["tasks.0.batch_size=lots"],
        "[at tasks[0].batch_size] (task 't_a')",
    ),
    "unimportable reward": (
        [task("t_a", reward_fn="nowhere.reward")],
        [],
        "tasks.0 ('t_a') reward_fn: cannot import 'nowhere.reward'",
    ),
    "lora rank vLLM cannot serve": ([task("t_a")], ["actor.lora_rank=12"], "12"),
    "evals without held-out rows": (
        [task("t_a", eval_interval=2)],
        [],
        "task 't_a': eval_interval=2 needs eval_dataset",
    ),
    "no eval samples": (
        [task("t_a", eval_samples=0)],
        [],
        "task 't_a': eval_samples must be an integer >= 1",
    ),
    "unknown method": ([task("t_a", method="ppo")], [], "method must be one of"),
    "sft with a kind": (
        [task("s", method="sft", dataset={"path": "d.jsonl"})],
        [],
        "task 's': kind is for method grpo",
    ),
    "sft without demonstrations": (
        [{"name": "s", "method": "sft"}],
        [],
        "task 's': method sft needs dataset.path",
    ),
    "negative eval interval": (
        [task("t_a", eval_interval=-1)],
        [],
        "task 't_a': eval_interval must be an integer >= 0",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_exits_nonzero_with_clear_error(case, capsys, tmp_path, main_yaml):
    tasks, overrides, message = BAD[case]
    tasks_yaml = write(tmp_path / "tasks.yaml", {"tasks": tasks})

    rc, out = check(capsys, "--config", main_yaml, "--tasks", tasks_yaml, *overrides)

    assert rc == 2
    assert "marlaas check: error:" in out
    assert message in out


def test_missing_tasks_file_is_a_clear_error(main_yaml):
    with pytest.raises(ConfigError, match="tasks_file: .*nope.yaml does not exist"):
        load_config(["--config", str(main_yaml), "tasks_file=nope.yaml"])


def test_no_tasks_at_all_is_a_clear_error(main_yaml):
    with pytest.raises(ConfigError, match="no tasks"):
        load_config(["--config", str(main_yaml)])


def test_corrupt_tasks_yaml_is_a_clear_error(main_yaml, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("tasks: [ {name: a, kind: addition\n")
    with pytest.raises(ConfigError, match="is not valid YAML"):
        load_config(["--config", str(main_yaml), "--tasks", str(bad)])


@pytest.mark.parametrize(
    "override, field",
    [
        ("scheduler.mode=fast", "scheduler.mode"),
        ("scheduler.kv_budget_fraction=1.5", "scheduler.kv_budget_fraction"),
        ("scheduler.max_concurrent_rollouts=-1", "scheduler.max_concurrent_rollouts"),
        ("scheduler.trainer_cpus=one", "scheduler.trainer_cpus"),
        ("server.cpu_affinity=3-1", "server.cpu_affinity"),
        ("scheduler.rollout_order=vtc", "scheduler.rollout_order"),
        ("vllm.scheduling_policy=lifo", "vllm.scheduling_policy"),
        ("actor.mb_spec.max_tokens_per_mb=512", "actor.mb_spec.max_tokens_per_mb"),
    ],
)
def test_bad_scheduler_setting_names_the_field(main_yaml, tmp_path, override, field):
    tasks = write(tmp_path / "t.yaml", {"tasks": [task("a")]})
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_config(["--config", str(main_yaml), "--tasks", str(tasks), override])


def test_fair_rollouts_start_the_server_with_priority_scheduling(main_yaml, tmp_path):
    tasks = write(tmp_path / "t.yaml", {"tasks": [task("a")]})
    base = ["--config", str(main_yaml), "--tasks", str(tasks)]

    assert load_config(base)[0].vllm.scheduling_policy == "fcfs"
    cfg, _ = load_config([*base, "scheduler.rollout_order=fair"])
    assert cfg.vllm.scheduling_policy == "priority"


def test_multi_lora_off_and_rollout_cap_set_max_rolling(main_yaml, tmp_path):
    tasks = write(tmp_path / "t.yaml", {"tasks": [task("a")]})
    base = ["--config", str(main_yaml), "--tasks", str(tasks)]

    assert load_config(base)[0].scheduler.max_rolling is None
    cfg, _ = load_config([*base, "scheduler.max_concurrent_rollouts=3"])
    assert cfg.scheduler.max_rolling == 3
    cfg, _ = load_config([*base, "scheduler.multi_lora=false"])
    assert cfg.scheduler.max_rolling == 1


def test_check_prints_the_admission_plan_for_a_budget(capsys, tmp_path, main_yaml):
    # 3 tasks of 2x2 sequences x (256 + 64) tokens x 46,080 B (float32): 59 MB
    # of KV each.
    tasks = write(tmp_path / "t.yaml", {"tasks": [task(n) for n in "abc"]})
    argv = ["--config", main_yaml, "--tasks", tasks]

    rc, out = check(capsys, *argv)
    assert rc == 0 and "first round admits: a, b, c" in out

    rc, out = check(capsys, *argv, "scheduler.kv_budget_bytes=120000000")
    assert rc == 0 and "first round admits: a, b\n" in out
    assert "held: c (kv)" in out

    rc, out = check(capsys, *argv, "scheduler.kv_budget_bytes=40000000")
    assert rc == 2 and "tasks.0 ('a')" in out and "could never be admitted" in out


def test_check_prints_the_loop_adaptive_concurrency_starts_with(
    capsys, tmp_path, main_yaml
):
    """Nothing measured yet: each task counts as half a trainer, so two of the
    three tasks start and the third waits for room in the loop."""
    tasks = write(tmp_path / "t.yaml", {"tasks": [task(n) for n in "abc"]})
    argv = ["--config", main_yaml, "--tasks", tasks, "scheduler.concurrency=adaptive"]

    rc, out = check(capsys, *argv)

    assert rc == 0 and "first round admits: a, b\n" in out
    assert "held: c (load)" in out


def test_shipped_bench_config_loads(model_path):
    from areal_marlaas.bench.run import load_bench_config

    bench, cfg, _, _ = load_bench_config(
        ["--config", str(REPO / "configs" / "bench.yaml")]
    )

    assert bench.replicas == 8 and set(bench.modes) >= {"async", "sync", "sequential"}
    assert cfg.tasks[0].name == bench.task


def test_config_reference_is_up_to_date():
    from areal_marlaas.config.reference import generate

    committed = (REPO / "docs" / "config.md").read_text()
    assert committed == generate(), (
        "docs/config.md is stale: run `marlaas config-docs --out docs/config.md`"
    )


def test_shipped_service_config_loads(model_path):
    from areal_marlaas.config.service import ServiceRunConfig

    cfg, _ = load_config(
        ["--config", str(REPO / "configs" / "service.yaml")], ServiceRunConfig
    )
    assert cfg.tasks == [] and cfg.service.port == 8000


def test_eval_rows_are_one_seeded_draw_of_held_out_problems():
    from areal_marlaas.config.tasks import TaskDatasetConfig, TaskSpec
    from areal_marlaas.tasks import load_eval_rows, load_task_rows

    spec = TaskSpec(
        name="add",
        kind="addition",
        dataset=TaskDatasetConfig(split="train", holdout=0.2, size=256),
        eval_dataset=TaskDatasetConfig(split="test", holdout=0.2, size=64),
        eval_interval=1,
        eval_samples=16,
    )
    rows = load_eval_rows(spec)
    assert len(rows) == 16 and rows == load_eval_rows(spec)
    train = {r["messages"][-1]["content"] for r in load_task_rows(spec)}
    assert not train & {r["messages"][-1]["content"] for r in rows}


def test_a_tenant_with_two_weights_is_refused_naming_the_field(tmp_path):
    import pytest

    from areal_marlaas.config import ConfigError, load_config

    tasks = tmp_path / "t.yaml"
    tasks.write_text(
        "tasks:\n"
        "  - {name: a, kind: addition, tenant: acme, weight: 2}\n"
        "  - {name: b, kind: addition, tenant: acme, weight: 1}\n"
    )
    with pytest.raises(ConfigError, match=r"tasks\.1\.weight: tenant 'acme'"):
        load_config(["--config", "configs/quickstart.yaml", "--tasks", str(tasks)])
    bad = tmp_path / "bad.yaml"
    bad.write_text("tasks:\n  - {name: a, kind: addition, weight: 0}\n")
    with pytest.raises(ConfigError, match="weight must be > 0"):
        load_config(["--config", "configs/quickstart.yaml", "--tasks", str(bad)])


def test_a_supervised_task_with_a_bad_demonstration_names_its_line(
    capsys, tmp_path, main_yaml
):
    data = tmp_path / "sft.jsonl"
    good = {
        "messages": [
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "b"},
        ]
    }
    data.write_text(
        json.dumps(good) + "\n" + json.dumps({"messages": [good["messages"][0]]}) + "\n"
    )
    sft = {"name": "s", "method": "sft", "dataset": {"path": str(data)}}
    tasks_yaml = write(tmp_path / "tasks.yaml", {"tasks": [task("t_a"), sft]})

    rc, out = check(capsys, "--config", main_yaml, "--tasks", tasks_yaml)

    assert rc == 2
    assert f"{data}:2: the last message must be the assistant's turn" in out
