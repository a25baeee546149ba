"""The run directory: what every task committed, plus the JSONL event/step logs.

Layout (``<cluster.fileroot>/<experiment_name>/<trial_name>/``)::

    events.jsonl                 one line per phase interval
    steps.jsonl                  one line per committed step
    summary.json                 written at the end
    tasks/<task>/state.json      the task's last committed version (atomic)
    tasks/<task>/adapters/v<N>/  PEFT adapter of each kept version

A version is committed when its adapter folder is complete *and* ``state.json``
names it; both are written via a temporary path and an atomic rename, so a crash
leaves either the old or the new version, never a half-written one.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path
from typing import Any

from areal.utils import logging

logger = logging.getLogger("MARLaaSRunStore")


def atomic_write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class RunStore:
    def __init__(self, root: str | Path, fresh: bool = True):
        """``fresh`` starts the run over: what an earlier run with the same names
        left here (logs, summary, task folders) is removed, so the logs describe
        this run only."""
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self.events_path = self.root / "events.jsonl"
        self.steps_path = self.root / "steps.jsonl"
        if fresh:
            self._clear()

    def _clear(self) -> None:
        old = [self.events_path, self.steps_path, self.root / "summary.json"]
        if any(p.exists() for p in old) or (self.root / "tasks").exists():
            logger.warning(f"{self.root} holds an earlier run; starting over")
        for p in old:
            p.unlink(missing_ok=True)
        shutil.rmtree(self.root / "tasks", ignore_errors=True)

    def task_dir(self, task: str) -> Path:
        return self.root / "tasks" / task

    def adapter_dir(self, task: str, version: int) -> Path:
        return self.task_dir(task) / "adapters" / f"v{version}"

    def commit(self, task: str, version: int, state: dict[str, Any]) -> None:
        """Record ``version`` (whose adapter folder is already complete)."""
        adapter = self.adapter_dir(task, version)
        if not (adapter / "adapter_model.safetensors").is_file():
            raise RuntimeError(
                f"cannot commit {task} v{version}: {adapter} is incomplete"
            )
        atomic_write_json(
            self.task_dir(task) / "state.json",
            {**state, "task": task, "version": version, "adapter": str(adapter)},
        )

    def committed(self, task: str) -> dict[str, Any] | None:
        path = self.task_dir(task) / "state.json"
        return json.loads(path.read_text()) if path.is_file() else None

    def prune_adapters(self, task: str, keep: set[int]) -> None:
        """Delete adapter folders of versions not in ``keep``."""
        root = self.task_dir(task) / "adapters"
        for d in root.glob("v*"):
            if d.name[1:].isdigit() and int(d.name[1:]) not in keep:
                shutil.rmtree(d, ignore_errors=True)

    def _append(self, path: Path, record: dict[str, Any]) -> None:
        line = json.dumps(record) + "\n"
        with self._lock, open(path, "a") as f:
            f.write(line)

    def event(self, task: str, version: int, phase: str, start: float, end: float):
        self._append(
            self.events_path,
            {
                "task": task,
                "version": version,
                "phase": phase,
                "start": start,
                "end": end,
            },
        )

    def record(self, record: dict[str, Any]) -> None:
        """A non-interval record in events.jsonl (admission, task status)."""
        self._append(self.events_path, record)

    def step(self, record: dict[str, Any]) -> None:
        self._append(self.steps_path, record)

    def write_summary(self, summary: dict[str, Any]) -> Path:
        path = self.root / "summary.json"
        atomic_write_json(path, summary)
        return path


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    path = Path(path)
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
