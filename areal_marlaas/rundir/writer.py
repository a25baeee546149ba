"""The run directory: what every task committed, plus the JSONL event/step logs.

Layout (``<cluster.fileroot>/<experiment_name>/<trial_name>/``)::

    events.jsonl                 one line per phase interval
    steps.jsonl                  one line per committed step
    evals.jsonl                  one line per held-out eval of a version
    summary.json                 written at the end
    tasks/<task>/state.json      the task's last committed version (atomic)
    tasks/<task>/adapters/v<N>/  PEFT adapter of each kept version
    tasks/<task>/evals/v<N>.jsonl  the samples of version N's eval

A version is committed when its adapter folder is complete *and* ``state.json``
names it; both are written via a temporary path and an atomic rename, so a crash
leaves either the old or the new version, never a half-written one. A step's line
in ``steps.jsonl`` is written just before its commit, so after a crash the logs hold
at most one step newer than ``state.json``; a resumed store (``fresh=False``) drops
it, and any half-written last line, so every task's versions stay contiguous.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections.abc import Mapping, Sequence
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
    def __init__(self, root: str | Path, fresh: bool | None = True):
        """``fresh`` starts the run over: what an earlier run with the same names
        left here (logs, summary, task folders) is removed, so the logs describe
        this run only. ``False`` continues it (``reconcile``); ``None`` opens it
        as it is (to read the layout)."""
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self.events_path = self.root / "events.jsonl"
        self.steps_path = self.root / "steps.jsonl"
        self.evals_path = self.root / "evals.jsonl"
        if fresh:
            self._clear()
        elif fresh is False:
            self.reconcile()

    def _clear(self) -> None:
        old = [
            self.events_path,
            self.steps_path,
            self.evals_path,
            self.root / "summary.json",
        ]
        if any(p.exists() for p in old) or (self.root / "tasks").exists():
            logger.warning(f"{self.root} holds an earlier run; starting over")
        for p in old:
            p.unlink(missing_ok=True)
        shutil.rmtree(self.root / "tasks", ignore_errors=True)

    def task_dir(self, task: str) -> Path:
        tasks = self.root / "tasks"
        path = tasks / task
        # Task names are validated in the config; this guards every other caller.
        if not task or path.resolve().parent != tasks.resolve():
            raise ValueError(f"task name {task!r} escapes the run directory {tasks}")
        return path

    def tasks(self) -> list[str]:
        """Tasks with a committed version in this run directory."""
        root = self.root / "tasks"
        if not root.is_dir():
            return []
        return sorted(p.name for p in root.iterdir() if (p / "state.json").is_file())

    def reconcile(self) -> dict[str, int]:
        """Make the logs agree with what was committed (after a crash).

        Drops a half-written last line, step records newer than a task's committed
        version (or repeating one already logged), and phase records of versions
        never committed. Returns how many lines were dropped per file.
        """
        versions: dict[str, int] = {}
        for t in self.tasks():
            state = self.committed(t)
            assert state is not None  # tasks() lists those with a state.json
            versions[t] = state["version"]
        dropped = {}
        for path, keep in (
            (self.steps_path, self._keep_step(versions)),
            (self.events_path, self._keep_event(versions)),
        ):
            dropped[path.name] = self._filter_jsonl(path, keep)
        if any(dropped.values()):
            logger.warning(f"{self.root}: dropped uncommitted log lines {dropped}")
        return dropped

    @staticmethod
    def _keep_step(versions: dict[str, int]):
        seen: set[tuple[Any, Any]] = set()  # (task, version) as logged

        def keep(r: dict[str, Any]) -> bool:
            key: tuple[Any, Any] = (r.get("task"), r.get("version"))
            # Tasks with no state.json here are left alone (nothing to compare).
            newer = r.get("task") in versions and r.get("version", 0) > versions[key[0]]
            if key in seen or newer:
                return False
            seen.add(key)
            return True

        return keep

    @staticmethod
    def _keep_event(versions: dict[str, int]):
        def keep(r: dict[str, Any]) -> bool:
            if r.get("task") not in versions or "version" not in r:
                return True
            # A train/publish of version v produced v + 1 (publish logs v + 1).
            made = r["version"] + (1 if r.get("phase") == "train" else 0)
            return made <= versions[r["task"]] or r.get("phase") in ("rollout", "queue")

        return keep

    def _filter_jsonl(self, path: Path, keep) -> int:
        if not path.is_file():
            return 0
        text = path.read_text()
        lines = text.split("\n")
        out, dropped = [], 0
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                # Only the last line can be half-written; anything else is damage.
                if i < len(lines) - 1 and any(x.strip() for x in lines[i + 1 :]):
                    raise ValueError(f"{path}:{i + 1} is not JSON") from None
                dropped += 1
                continue
            if keep(record):
                out.append(line)
            else:
                dropped += 1
        if dropped or (text and not text.endswith("\n")):
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text("".join(f"{line}\n" for line in out))
            os.replace(tmp, path)
        return dropped

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

    def retain_adapters(self, task: str, keep_last: int, served: int) -> None:
        """Keep the newest ``keep_last`` committed versions (0 = all), the served
        version and anything newer than the commit (being written/published)."""
        if keep_last <= 0:
            return
        state = self.committed(task)
        if state is None:
            return
        newest = state["version"]
        root = self.task_dir(task) / "adapters"
        versions = {int(d.name[1:]) for d in root.glob("v*") if d.name[1:].isdigit()}
        keep = {v for v in versions if v > newest - keep_last or v == served}
        self.prune_adapters(task, keep)

    def prune_adapters(self, task: str, keep: set[int]) -> None:
        """Delete adapter folders of versions not in ``keep``."""
        root = self.task_dir(task) / "adapters"
        for d in root.glob("v*"):
            if d.name[1:].isdigit() and int(d.name[1:]) not in keep:
                shutil.rmtree(d, ignore_errors=True)

    def _append(self, path: Path, record: Mapping[str, Any]) -> None:
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

    def step(self, record: Mapping[str, Any]) -> None:
        """A committed step's line in steps.jsonl (a ``StepRecord``)."""
        self._append(self.steps_path, record)

    def eval(self, record: Mapping[str, Any], samples: Sequence[Mapping[str, Any]]):
        """A version's eval: its samples (atomically), then its evals.jsonl line
        (an ``EvalRecord``), so a line always has its samples."""
        folder = self.task_dir(record["task"]) / "evals"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"v{record['version']}.jsonl"
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text("".join(json.dumps(s) + "\n" for s in samples))
        os.replace(tmp, path)
        self._append(self.evals_path, record)

    def eval_samples(self, task: str, version: int) -> list[dict[str, Any]]:
        path = self.task_dir(task) / "evals" / f"v{version}.jsonl"
        if not path.is_file():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line]

    def write_summary(self, summary: dict[str, Any]) -> Path:
        path = self.root / "summary.json"
        atomic_write_json(path, summary)
        return path
