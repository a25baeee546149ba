"""Reading a run directory: the one home of its readers.

The run store (``rundir/writer.py``) writes ``events.jsonl``, ``steps.jsonl``,
``summary.json`` and ``tasks/<task>/...``; everything that reads them back (report,
bench, simulator, learning benchmark) goes through here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# Phase intervals in events.jsonl, in loop order. wait: ready but held (admission,
# a sync barrier or a single-task turn); env: the environment (tool calls).
PHASES = ("wait", "rollout", "env", "queue", "train", "publish")


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    path = Path(path)
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def load_run(run_dir: str | Path) -> dict[str, Any]:
    """``{"events", "steps", "summary"}`` of a run directory."""
    run_dir = Path(run_dir)
    summary_path = run_dir / "summary.json"
    return {
        "events": read_jsonl(run_dir / "events.jsonl"),
        "steps": read_jsonl(run_dir / "steps.jsonl"),
        "summary": json.loads(summary_path.read_text())
        if summary_path.is_file()
        else {},
    }


def phase_records(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Phase intervals only (admission and failure records carry no ``phase``)."""
    return [e for e in events if "phase" in e and "start" in e and "end" in e]


def task_steps(run_dir: str | Path, task: str) -> list[dict[str, Any]]:
    """One task's committed steps, in version order."""
    steps = read_jsonl(Path(run_dir) / "steps.jsonl")
    return sorted((s for s in steps if s["task"] == task), key=lambda s: s["version"])


def rewards_of(run_dir: str | Path, task: str) -> list[float]:
    return [s["reward_mean"] for s in task_steps(run_dir, task)]
