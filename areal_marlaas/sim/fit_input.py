"""The simulator's fit input: what the latency fit reads of a bench's runs, in one
small file beside bench.json.

A bench's raw run folders (``runs/<label>/{events,samples,steps}.jsonl``) are
megabytes and are not committed; the fit reads only each run's phase records of
the phases it models (their task, version and interval) and, per task, the
sequences of one rollout batch. ``fit_input.json`` holds exactly those, times
as the run logs hold them (the bench writes them to the ms), so a result folder
with bench.json and fit_input.json fits the same models as its raw runs
(``marlaas simulate`` reads the raw folders when they are there).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from areal_marlaas.rundir.reader import phase_records, read_jsonl

FIT_INPUT = "fit_input.json"
FORMAT = 1
# The phases the latency fit models (wait and queue are the scheduler's, which
# the simulator runs itself) and the fields it reads of each record.
FIT_PHASES = ("rollout", "env", "train", "publish")
FIELDS = ("phase", "task", "version", "start", "end")

Events = list[dict[str, Any]]


def fit_events(events: Events) -> Events:
    """The records the fit reads, in record order (the fit pairs train steps with
    their overlaps by it), with only the fields it reads."""
    return [
        {k: e.get(k) for k in FIELDS}
        for e in phase_records(events)
        if e["phase"] in FIT_PHASES
    ]


def task_seqs(run: dict[str, Any], steps: list[dict[str, Any]]) -> dict[str, int]:
    """Per task, the sequences of one rollout batch: those that came back (failed
    requests are dropped) where the steps record them, else the configured ones."""
    tasks = run.get("tasks") or []
    seqs = {t["name"]: t["batch_size"] * t["n_samples"] for t in tasks}
    got: dict[str, list[int]] = {}
    for s in steps:
        if s.get("n_trajectories"):
            got.setdefault(s["task"], []).append(s["n_trajectories"])
    for task, ns in got.items():
        seqs[task] = round(statistics.fmean(ns))
    return seqs


def ok_runs(result: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in result["runs"] if r.get("status") == "ok"]


def raw_run(run: dict[str, Any], root: Path) -> tuple[Events, dict[str, int]] | None:
    """A run's events and batch sizes from its raw folder; None without one."""
    d = Path(root) / "runs" / run["label"]
    if not (d / "events.jsonl").is_file():
        return None
    return read_jsonl(d / "events.jsonl"), task_seqs(run, read_jsonl(d / "steps.jsonl"))


def build_fit_input(result: dict[str, Any], root: str | Path) -> dict[str, Any]:
    """The fit input of every successful run of ``result`` with a raw folder under
    ``root``."""
    runs = {}
    for r in ok_runs(result):
        raw = raw_run(r, Path(root))
        if raw is None:
            continue
        events, seqs = raw
        runs[r["label"]] = {
            "seqs": seqs,
            "events": [[e[k] for k in FIELDS] for e in fit_events(events)],
        }
    return {"format": FORMAT, "fields": list(FIELDS), "runs": runs}


def dumps(data: dict[str, Any]) -> str:
    """One event per line: small, and a re-run's diff reads by record. A run's
    other entries (``seqs``, and what a caller adds) take a line each."""
    head = {"format": data["format"], "fields": data["fields"]}
    lines = ["{" + json.dumps(head)[1:-1] + ",", ' "runs": {']
    labels = list(data["runs"])
    for i, label in enumerate(labels):
        run = data["runs"][label]
        rows = [f"   {json.dumps(e)}" for e in run["events"]]
        lines += [
            f"  {json.dumps(label)}: {{",
            *(
                f"   {json.dumps(key)}: {json.dumps(value)},"
                for key, value in run.items()
                if key != "events"
            ),
            '   "events": [',
            ",\n".join(rows),
            "   ]",
            "  }" + ("," if i < len(labels) - 1 else ""),
        ]
    lines += [" }", "}"]
    return "\n".join(line for line in lines if line) + "\n"


def write_fit_input(result: dict[str, Any], root: str | Path) -> Path | None:
    """Write ``root/fit_input.json`` from the raw run folders under ``root``;
    nothing when no run has one (a bench of replicated AReaL jobs only)."""
    data = build_fit_input(result, root)
    if not data["runs"]:
        return None
    path = Path(root) / FIT_INPUT
    path.write_text(dumps(data))
    return path


def load_fit_input(root: str | Path) -> dict[str, tuple[Events, dict[str, int]]]:
    """label -> (events, seqs) of ``root/fit_input.json``; empty without one."""
    path = Path(root) / FIT_INPUT
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    if data.get("format") != FORMAT:
        raise ValueError(f"{path}: format {data.get('format')}, expected {FORMAT}")
    fields = data["fields"]
    return {
        label: ([dict(zip(fields, e, strict=True)) for e in run["events"]], run["seqs"])
        for label, run in data["runs"].items()
    }
