"""What the GPU check's runner, report and steps share: paths, small helpers and the
plan's types. Standard library only."""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_check.py"
STEPS_DIR = REPO / "scripts" / "gpu_check_steps"
STUBS_DIR = STEPS_DIR / "offline_stubs"
TAIL_CHARS = 4000

# Modules whose import means "the plugin's trainer can run with this interpreter".
TRAINER_IMPORTS = "areal_marlaas.train.engine,areal_marlaas.model_prep"
# Heavy AReaL imports that no single-process FSDP step calls; on an offline machine
# without them, scripts/gpu_check_steps/offline_stubs stands in (recorded).
STUB_MODULES = "ray,wandb,swanlab,trackio"

STATUSES = ("pending", "ok", "failed", "timeout", "skipped")
# A dry run's preview of a step that the setup step's probes decide.
AFTER_SETUP = "decided after setup"


# -- small helpers ----------------------------------------------------------------
def now_iso() -> str:
    utc = datetime.timezone.utc  # noqa: UP017 (datetime.UTC needs 3.11; this runs on 3.8+)
    return datetime.datetime.now(utc).isoformat(timespec="seconds")


def sha16(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def tail(text: str, n: int = TAIL_CHARS) -> str:
    return text if len(text) <= n else "..." + text[-n:]


def cache_dir() -> Path:
    root = os.environ.get("MARLAAS_CACHE")
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "areal-marlaas"


def quick(argv: list[str], timeout: float = 30.0, env=None) -> dict[str, Any]:
    """Run a short command; never raises."""
    try:
        p = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )
        return {"rc": p.returncode, "out": p.stdout, "err": p.stderr}
    except FileNotFoundError as e:
        return {"rc": None, "out": "", "err": f"not found: {e}"}
    except subprocess.TimeoutExpired:
        return {"rc": None, "out": "", "err": f"timed out after {timeout:.0f} s"}


def last_error_line(text: str) -> str:
    """The most telling line of a failed step's output."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if re.search(r"(Error|Exception|FAILED|error:|Traceback)", ln):
            return ln[:400]
    return lines[-1][:400] if lines else ""


# -- plan ---------------------------------------------------------------------------


@dataclass
class Command:
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)  # added to os.environ
    cwd: str = str(REPO)
    result_file: str | None = None  # JSON the step may write


@dataclass
class Skip:
    reason: str


@dataclass
class Step:
    name: str
    budget_s: float
    what: str
    # ctx -> Command | Skip; called just before the step runs (facts up to date).
    command: Callable[[Ctx], Any]
    # ctx -> (action, why) for the dry-run plan, from the probes alone.
    preview: Callable[[Ctx], Any] | None = None
    # (ctx, result) -> None: read the step's outputs into result.metrics / ctx.facts.
    post: Callable[[Ctx, StepResult], None] | None = None
    in_deadline: bool = True
    selected: bool = True  # False: left out by --only/--skip (not in the budget sum)


@dataclass
class StepResult:
    name: str
    budget_s: float
    in_deadline: bool = True
    status: str = "pending"
    reason: str = ""
    timeout_s: float | None = None
    started: str | None = None
    elapsed_s: float | None = None
    returncode: int | None = None
    command: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    tail: str = ""
    reaped_pids: list[int] = field(default_factory=list)


@dataclass
class Ctx:
    args: argparse.Namespace
    out: Path
    work: Path
    token: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def log_path(self) -> Path:
        return self.out / "gpu_check.log"


# -- internal steps (run as subprocesses of gpu_check.py) --------------------------
def internal(ctx: Ctx, name: str) -> Command:
    ctx_file = ctx.work / "ctx.json"
    ctx_file.write_text(
        json.dumps({"args": vars(ctx.args), "facts": ctx.facts, "work": str(ctx.work)})
    )
    result = ctx.work / f"{name}.result.json"
    return Command(
        [
            sys.executable,
            str(SCRIPT),
            "--_internal",
            name,
            "--_ctx",
            str(ctx_file),
        ],
        result_file=str(result),
    )


def load_internal_ctx(path: str) -> Ctx:
    data = json.loads(Path(path).read_text())
    args = argparse.Namespace(**data["args"])
    ctx = Ctx(args=args, out=Path(args.out_resolved), work=Path(data["work"]))
    ctx.facts = data["facts"]
    return ctx


def write_result(data: dict[str, Any]) -> None:
    path = os.environ.get("GPU_CHECK_RESULT")
    if path:
        Path(path).write_text(json.dumps(data, indent=1, default=str))
