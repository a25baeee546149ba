"""What a person sees while ``marlaas train`` runs: a quiet screen.

One line per phase of start-up, one line per committed step (with that task's
progress bar), warnings and errors, and the end table. AReaL's banners, per-step
stats tables and INFO logs go to ``<run dir>/logs/`` instead; ``--verbose`` (or
``verbose=true``) puts them back on the screen too.
"""

from __future__ import annotations

import contextlib
import logging
import logging.config
import os
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from areal.utils import logging as areal_logging

from areal_marlaas.config import MARLaaSConfig
from areal_marlaas.fmt import fmt
from areal_marlaas.rundir.records import EvalRecord, StepRecord

_CONSOLE_HANDLERS = ("plainHandler", "coloredHandler", "systemHandler")
# Set in a worker's environment (LocalScheduler spec) when the screen is quiet:
# AReaL streams every worker's output to the driver's terminal.
QUIET_ENV = "MARLAAS_QUIET"
BAR = 10


def quiet_console() -> None:
    """AReaL's loggers print INFO to stdout; keep warnings and errors only."""
    # AReaL re-applies this dict at every getLogger call, so new loggers get the
    # level; the ones already made keep their own handlers (each call makes a
    # new logging manager), so those are quieted one by one.
    # torch's deprecation of how AReaL slices its FSDP mesh: nothing a user can
    # act on, printed at every start.
    warnings.filterwarnings(
        "ignore", message="Slicing a flattened dim from root mesh", category=UserWarning
    )
    # AReaL's fallback notice on every machine without NVIDIA's fused kernels.
    warnings.filterwarnings(
        "ignore", message="Transformer Engine and Apex are not installed"
    )
    for name in _CONSOLE_HANDLERS:
        areal_logging.log_config["handlers"][name]["level"] = "WARNING"
    logging.config.dictConfig(areal_logging.log_config)
    for made in list(areal_logging._created_loggers.values()):
        for handler in made.handlers:
            if not isinstance(handler, logging.FileHandler):
                handler.setLevel(logging.WARNING)


def asks_verbose(argv: list[str]) -> bool:
    """Whether a command line asks for AReaL's logs on the screen (read before
    the config is loaded; ``verbose: true`` in a YAML is honoured later)."""
    return any(a == "--verbose" or a.lower() == "verbose=true" for a in argv)


def quiet_if_asked() -> None:
    """In an AReaL worker process: quiet its console like the driver's."""
    if os.environ.get(QUIET_ENV) == "1":
        quiet_console()


def quiet_logs(cfg: MARLaaSConfig, log_dir: Path | None = None) -> Path:
    """Send AReaL's INFO logs to ``<run dir>/logs/main.log`` (and merged.log);
    the screen keeps warnings and errors unless ``cfg.verbose``."""
    log_dir = log_dir or cfg.run_dir / "logs"
    if not cfg.verbose:
        quiet_console()
    areal_logging.setup_file_logging(str(log_dir))
    return log_dir


@contextlib.contextmanager
def native_stdout_muted(muted: bool = True) -> Iterator[None]:
    """Point file descriptor 1 at /dev/null for a block: native code (gloo's
    "[Gloo] Rank 0 is connected to 0 peer ranks") writes there directly, past
    Python's ``sys.stdout``."""
    if not muted:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as sink:
            os.dup2(sink.fileno(), 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def make_stats_logger(cfg: MARLaaSConfig, ft_spec):
    """AReaL's StatsLogger. With swanlab disabled (the default) swanlab prints
    "SwanLab run disabled" at every start: nothing to act on, so it is muted."""
    from areal.utils.stats_logger import StatsLogger

    if cfg.stats_logger.swanlab.mode != "disabled":
        return StatsLogger(cfg, ft_spec)
    from swanlab.log import swanlog

    swanlog.disable_log()
    try:
        return StatsLogger(cfg, ft_spec)
    finally:
        swanlog.enable_log()


def bar(done: int, total: int, width: int = BAR) -> str:
    filled = round(width * done / total) if total else width
    return "[" + "#" * filled + "." * (width - filled) + "]"


class Screen:
    """Prints to stdout (not through a logger, so quiet logs never hide it)."""

    def __init__(
        self,
        cfg: MARLaaSConfig,
        run_dir: Path,
        stream=None,
        title: str = "marlaas train",
    ):
        self.cfg = cfg
        self.run_dir = run_dir
        self.stream = stream or sys.stdout
        self.t0 = time.monotonic()
        self.tasks: dict[str, tuple[int, int]] = {}  # name -> (done, total)
        self.commits = 0
        self._lock = threading.Lock()
        self.print(
            f"{title}: {len(cfg.tasks)} task(s), mode {cfg.scheduler.mode}, "
            f"scheduler {cfg.scheduler.type or 'in-process'}; logs in "
            f"{run_dir / 'logs'}"
        )

    def print(self, line: str) -> None:
        with self._lock:
            print(f"[{time.monotonic() - self.t0:7.1f}s] {line}", file=self.stream)
            self.stream.flush()

    def phase(self, what: str) -> None:
        self.print(what)

    def start(self, tasks: dict[str, tuple[int, int]], setup_s: float) -> None:
        """``tasks``: name -> (starting version, total steps)."""
        self.tasks = dict(tasks)
        names = ", ".join(f"{n} ({v}/{t})" for n, (v, t) in tasks.items())
        self.print(f"training {names}; set-up took {setup_s:.1f}s")

    def add(self, name: str, start_version: int, total: int) -> None:
        """A task that joined later (a service job)."""
        with self._lock:
            self.tasks[name] = (start_version, total)

    def step(self, r: StepRecord) -> int:
        """One committed step; returns how many were committed so far."""
        with self._lock:
            self.commits += 1
            _, total = self.tasks.get(r["task"], (0, r["version"]))
            self.tasks[r["task"]] = (r["version"], total)
            n = self.commits
        gap = r.get("logprob_gap_mean")
        self.print(
            f"{r['task']:<12} {bar(r['version'], total)} {r['version']}/{total} "
            f"{_score(r)}  train {r['train_s']:.1f}s  "
            f"queue {r['queue_wait_s']:.1f}s"
            + (f"  logprob gap {gap:.1e}" if gap is not None else "")
        )
        return n

    def eval(self, r: EvalRecord) -> None:
        """One held-out eval of a committed version."""
        if r["reward_mean"] is None:
            why = r.get("error") or f"all {r['failed']} episodes failed"
            self.print(f"{r['task']:<12} eval v{r['version']} failed: {why}")
            return
        failed = f", {r['failed']} failed" if r["failed"] else ""
        self.print(
            f"{r['task']:<12} eval v{r['version']}: reward {r['reward_mean']:.3f} "
            f"on {r['samples']} held-out rows{failed} ({r['end'] - r['start']:.1f}s)"
        )


def _num(x: float | None, fmt: str = ".3f") -> str:
    return "-" if x is None else format(x, fmt)


def _score(r: StepRecord) -> str:
    """A step's score: its reward, a supervised step's loss (and token
    accuracy; validation loss when it was scored), or a DPO step's loss and
    preference accuracy."""
    pref = r.get("preference")
    if pref is not None:
        out = f"loss {_num(r['loss'])} pref acc "
        out += _num(pref.get("train_preference_accuracy"))
        if "valid_preference_accuracy" in pref:
            out += f" valid {_num(pref['valid_preference_accuracy'])}"
        return out
    sup = r.get("supervised")
    if sup is None:
        return f"reward {_num(r['reward_mean'])}"
    out = f"loss {_num(r['loss'])} acc {_num(sup.get('train_mean_token_accuracy'))}"
    if "valid_loss" in sup:
        out += f" valid {_num(sup['valid_loss'])}"
    return out


def format_summary(summary: dict[str, Any]) -> str:
    cols = ["task", "status", "steps", "version", "reward_first", "reward_last"]
    cols += ["ttfs_s", "tpts_p50_s", "eval_last"]
    lines = ["  ".join(f"{c:>12}" for c in cols)]
    for name, t in summary["tasks"].items():
        vals = [name, t["status"], t["steps"], t["final_version"]]
        vals += [t.get(k) for k in ("reward_first", "reward_last")]
        vals += [t.get(k) for k in ("ttfs_s", "tpts_p50_s")]
        last = t.get("eval_last")  # (version, reward) of the newest eval
        vals.append(last[1] if last else None)
        lines.append("  ".join(f"{fmt(v, 3):>12}" for v in vals))
    for name, t in summary["tasks"].items():
        if t["status"] != "done" and t.get("error"):
            lines.append(f"{name} {t['status']}: {t['error']}")
    lines.append(
        f"mode={summary['mode']} wall={summary['wall_s']:.1f}s "
        f"train_steps/h={summary['train_steps_per_hour']:.1f} "
        f"admission_holds={summary.get('admission_holds', 0)}"
    )
    lines.append(f"run dir: {summary['run_dir']}")
    return "\n".join(lines)
