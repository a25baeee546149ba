"""``marlaas train`` as a benchmark runs it: a tasks file, a fresh process (the
user's path), its output in the run's folder, and the run directory back."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def run_train(
    tasks: list[dict], here: Path, fileroot: Path, overrides: Sequence[str] = ()
) -> Path:
    """Write ``here/tasks.yaml``, run ``marlaas train`` on the quickstart config
    with it (trial ``here.name``, runs under ``fileroot``), keep its screen in
    ``here/train.log``; return its run directory. Exits naming the log when
    the run fails."""
    here.mkdir(parents=True, exist_ok=True)
    tasks_file = here / "tasks.yaml"
    tasks_file.write_text(yaml.safe_dump({"tasks": tasks}))
    cmd = [
        sys.executable,
        "-m",
        "areal_marlaas.cli",
        "train",
        "--config",
        str(ROOT / "configs" / "quickstart.yaml"),
        f"tasks_file={tasks_file}",
        f"cluster.fileroot={fileroot.resolve()}",
        f"trial_name={here.name}",
        *overrides,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    (here / "train.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise SystemExit(f"{here.name}: marlaas train failed; see {here}/train.log")
    return Path(proc.stdout.strip().splitlines()[-1].split("run dir: ", 1)[1])


def write_result(out: Path, name: str, result: dict, text: str) -> None:
    """``<out>/<name>.json`` (with the command and the machine) and ``.md``;
    the table is printed too."""
    import json

    from areal_marlaas.bench.machine import describe, machine

    script = Path(sys.argv[0]).name
    result = {
        "command": f"python scripts/{script} " + " ".join(sys.argv[1:]),
        "machine": describe(machine()),
        **result,
    }
    (out / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / f"{name}.md").write_text(f"`{result['command']}`\n\n{text}")
    print(text, flush=True)
