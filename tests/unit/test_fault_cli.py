"""Malformed tasks YAML: ``marlaas check`` and ``marlaas train`` exit 2 with an
error that names the task and the field, and write nothing."""

from __future__ import annotations

import pytest

from areal_marlaas.cli import main
from tests.support.paths import REPO

CASES = {
    "syntax": (
        "tasks:\n  - name: add2\n    batch_size: [4\n",
        ["not valid YAML", "line"],
    ),
    "unknown_field": (
        "tasks:\n  - {name: add2, kind: addition}\n"
        "  - {name: mul1, kind: multiplication, batchsize: 4}\n",
        ["tasks.1 ('mul1')", "batchsize"],
    ),
    "wrong_type": (
        "tasks:\n  - {name: add2, kind: addition, batch_size: four}\n",
        ["tasks.0 ('add2')", "batch_size", "'four'"],
    ),
    "bad_value": (
        "tasks:\n  - {name: add2, kind: addition, n_samples: 1}\n",
        ["task 'add2'", "n_samples must be >= 2"],
    ),
    "unsafe_name": (
        "tasks:\n  - {name: ../evil, kind: addition}\n",
        ["task '../evil'", "name must match"],
    ),
    "duplicate_name": (
        "tasks:\n  - {name: add2, kind: addition}\n  - {name: add2, kind: addition}\n",
        ["tasks.1", "duplicate task name 'add2'"],
    ),
    "bad_timeout": (
        "tasks:\n  - {name: add2, kind: addition, reward_timeout_s: -1}\n",
        ["task 'add2'", "reward_timeout_s must be >= 0"],
    ),
    "not_a_list": ("tasks: {name: add2}\n", ["must hold a `tasks:` list"]),
}


@pytest.mark.parametrize("command", ["check", "train"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_malformed_tasks_yaml_exits_2_naming_task_and_field(
    tmp_path, capsys, command, case
):
    text, expected = CASES[case]
    tasks = tmp_path / "tasks.yaml"
    tasks.write_text(text)
    root = tmp_path / "root"
    argv = [command, "--config", str(REPO / "configs" / "quickstart.yaml")]
    argv += ["--tasks", str(tasks), f"cluster.fileroot={root}"]

    rc = main(argv)

    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith(f"marlaas {command}: error:")
    for part in expected:
        assert part in err, err
    assert not root.exists()  # no run directory, nothing written
