#!/usr/bin/env python3
"""The GPU check: one command that runs areal-marlaas on CUDA unattended and records
what it measured.

    python3 scripts/gpu_check.py [--out DIR] [--deadline-s 570] [--wheelhouse DIR]
    python3 scripts/gpu_check.py --dry-run          # plan + environment checks, no GPU

Steps, in order, each a subprocess in its own process group with its own time budget
(killed at its budget or at the global deadline, whichever comes first):

  build              venvs + default model, only when missing and buildable (network
                     or wheelhouse); cached under $MARLAAS_CACHE; outside the deadline
  setup              machine facts, interpreters, which packages import, wheelhouse
  model              the bf16 model (real SmolLM2, else a SmolLM2-shaped random one),
                     tiny Llama/Qwen3 models for the parity checks
  trainer_cuda       the plugin's FSDP trainer alone on CUDA (needs no vLLM): packed-
                     attention parity, LoRA slot swap, step time bf16 vs float32,
                     trained-adapter logprobs vs PEFT, seeded repeatability
  rollout_multilora  pytest tests/e2e/test_rollout_multilora.py on a CUDA vLLM server
  logprob_agreement  vLLM vs trainer logprobs of a GRPO-trained adapter, bf16 and
                     float32, and the adapter hot-swap (publish) time
  quickstart         marlaas train --config configs/quickstart.yaml (bf16, CUDA)
  bench              marlaas bench: 8 tenants, async vs sync vs sequential

A step whose requirement is missing (no GPU, no CUDA vLLM, AReaL not importable) is
skipped with the reason. ``gpu_check.json`` and ``gpu_check.md`` are rewritten after
every step under $OUT if set, else --out (default runs/gpu_check, git-ignored; a GPU
run's files are committed by hand under docs/results/gpu/, see docs/gpu_check.md);
the summary table is printed last.

On a machine without a GPU (no nvidia-smi listing one, no /dev/nvidia0) the check
refuses to run and writes nothing: a CPU run would read like a GPU result. There,
``make gpu-check-dry`` (``--dry-run``) checks the plan and the environment;
``--allow-no-gpu`` (developing this script) or ``--allow-cpu`` runs it anyway.

This file holds the runner (deadlines, timeouts, process groups) and the report;
each step's code is in scripts/gpu_check_steps/. Only the standard library: this runs
under any python3 >= 3.8, e.g. a GPU machine's own interpreter before (or without)
the project's venvs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

# The steps are a package beside this script, which runs from any directory.
_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from gpu_check_steps.common import (  # noqa: E402
    REPO,
    STUB_MODULES,
    Command,
    Ctx,
    Skip,
    Step,
    StepResult,
    cache_dir,
    last_error_line,
    load_internal_ctx,
    now_iso,
    tail,
)
from gpu_check_steps.cuda_steps import bench_modes  # noqa: E402
from gpu_check_steps.environment import (  # noqa: E402
    gather_facts,
    gpu_listed,
    machine_facts,
    network_ok,
)
from gpu_check_steps.plan import BUDGETS, INTERNAL, make_steps  # noqa: E402
from gpu_check_steps.wheelhouse import fetch_wheels  # noqa: E402

# Names the tests and callers reach through this module.
__all__ = ["BUDGETS", "Command", "Ctx", "Skip", "Step", "StepResult", "make_steps"]

SCHEMA = 1

DEFAULT_DEADLINE_S = 570.0
# Seconds kept back from the deadline: a killed step's SIGTERM grace and the reaping
# of what it left (KILL_GRACE_S each at most), and the report write.
RESERVE_S = 12.0
# A step is not started with less than this left before the deadline.
MIN_START_S = 15.0
KILL_GRACE_S = 4.0
LOG_CAP_CHARS = 300_000
# Where a real run writes without $OUT or --out: ignored by git, so that only a GPU
# run's files, copied by hand, land in docs/results/gpu/.
DEFAULT_OUT = REPO / "runs" / "gpu_check"
# The exit status of a real run refused for want of a GPU.
EXIT_NO_GPU = 3

# Documented CPU numbers to print beside the GPU ones (docs/cpu_serving.md).
CPU_LOGPROB_GAP = {"bfloat16": 0.035, "float32": "<1e-4"}
CPU_BENCH_JSON = REPO / "docs" / "results" / "bench" / "bench.json"


# -- process control ---------------------------------------------------------------
# -- process control -------------------------------------------------------------------
def kill_group(proc: subprocess.Popen, grace: float = KILL_GRACE_S) -> None:
    """SIGTERM the step's process group, then SIGKILL what is left after ``grace``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(grace)
            # The leader is gone; make sure no member of its group outlives it.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            return
        except subprocess.TimeoutExpired:
            continue
    proc.wait()


def marked_pids(token: str) -> list[int]:
    """Processes started by this run: they carry GPU_CHECK_TOKEN=<token> in their
    environment (inherited by every descendant, also ones in new sessions, such as
    the vLLM server and its engine core)."""
    needle = f"GPU_CHECK_TOKEN={token}".encode()
    out = []
    for d in Path("/proc").glob("[0-9]*"):
        pid = int(d.name)
        if pid == os.getpid():
            continue
        try:
            env = (d / "environ").read_bytes()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            out.append(pid)
    return out


def reap_marked(token: str, grace: float = KILL_GRACE_S) -> list[int]:
    """End, by pid, whatever this run started that is still alive."""
    pids = marked_pids(token)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    t_end = time.monotonic() + grace
    while time.monotonic() < t_end and any(_alive(p) for p in pids):
        time.sleep(0.1)
    for pid in pids:
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    return pids


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is dead for our purposes
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# -- the runner (deadline and timeouts) ----------------------------------------------
# -- the runner (deadline and timeouts) ------------------------------------------------
class Runner:
    def __init__(
        self,
        steps: list[Step],
        ctx: Ctx,
        deadline_s: float,
        report: Callable[[Runner], None],
        clock: Callable[[], float] = time.monotonic,
        reserve_s: float = RESERVE_S,
        min_start_s: float = MIN_START_S,
    ):
        self.steps = steps
        self.ctx = ctx
        self.deadline_s = deadline_s
        self.report = report
        self.clock = clock
        self.reserve_s = reserve_s
        self.min_start_s = min_start_s
        self.results = [StepResult(s.name, s.budget_s, s.in_deadline) for s in steps]
        self.t0 = clock()
        self.deadline_at: float | None = None  # set when the first timed step starts
        self.started = now_iso()
        self.finished: str | None = None

    def remaining(self) -> float:
        if self.deadline_at is None:
            return self.deadline_s
        return self.deadline_at - self.clock()

    def _report(self) -> None:
        """Write the files; a bug in the report must not stop the steps."""
        try:
            self.report(self)
        except Exception as e:
            print(f"[gpu-check] report failed: {type(e).__name__}: {e}", flush=True)

    def run(self) -> list[StepResult]:
        self._report()
        for step, res in zip(self.steps, self.results, strict=True):
            if step.in_deadline and self.deadline_at is None:
                self.deadline_at = self.clock() + self.deadline_s
            self.run_step(step, res)
            self._report()
            print(
                f"[gpu-check] {res.name}: {res.status}"
                + (f" in {res.elapsed_s:.1f} s" if res.elapsed_s is not None else "")
                + (f" ({res.reason})" if res.reason else ""),
                flush=True,
            )
        self.finished = now_iso()
        self._report()
        return self.results

    def run_step(self, step: Step, res: StepResult) -> None:
        res.started = now_iso()
        timeout = step.budget_s
        deadline_bound = False
        if step.in_deadline:
            left = self.remaining() - self.reserve_s
            if left < self.min_start_s:
                res.status = "skipped"
                res.reason = (
                    f"global deadline: {max(left, 0):.0f} s left of "
                    f"{self.deadline_s:.0f} s, too little to start"
                )
                return
            if left < timeout:
                timeout, deadline_bound = left, True
        try:
            cmd = step.command(self.ctx)
        except Exception as e:  # a bug in a step's planning must not stop the run
            res.status, res.reason = "failed", f"planning: {type(e).__name__}: {e}"
            return
        if isinstance(cmd, Skip):
            res.status, res.reason = "skipped", cmd.reason
            return
        res.timeout_s = round(timeout, 1)
        res.command = " ".join(cmd.argv)
        print(
            f"[gpu-check] {step.name}: start (budget {step.budget_s:.0f} s, "
            f"limit {timeout:.0f} s)",
            flush=True,
        )
        env = {**os.environ, **cmd.env, "GPU_CHECK_TOKEN": self.ctx.token}
        if cmd.result_file:
            env["GPU_CHECK_RESULT"] = cmd.result_file
            if Path(cmd.result_file).exists():
                Path(cmd.result_file).unlink()
        step_log = self.ctx.work / "logs" / f"{step.name}.log"
        step_log.parent.mkdir(parents=True, exist_ok=True)
        t0 = self.clock()
        timed_out = False
        with open(step_log, "wb") as log:
            try:
                proc = subprocess.Popen(
                    cmd.argv,
                    cwd=cmd.cwd,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,  # its own process group
                )
            except OSError as e:
                res.status, res.reason = "failed", f"could not start: {e}"
                res.elapsed_s = 0.0
                return
            try:
                res.returncode = proc.wait(timeout=max(timeout, 0.1))
            except subprocess.TimeoutExpired:
                timed_out = True
                kill_group(proc)
                res.returncode = proc.returncode
            except KeyboardInterrupt:  # Ctrl-C or SIGTERM: stop it, then stop
                kill_group(proc)
                reap_marked(self.ctx.token)
                res.status, res.reason = "failed", "interrupted (SIGINT/SIGTERM)"
                res.elapsed_s = round(self.clock() - t0, 2)
                self.finished = now_iso()
                self._report()
                raise
        res.reaped_pids = reap_marked(self.ctx.token)
        res.elapsed_s = round(self.clock() - t0, 2)
        text = step_log.read_text(errors="replace")
        res.tail = tail(text)
        self._append_log(step.name, text)
        if cmd.result_file and Path(cmd.result_file).is_file():
            try:
                data = json.loads(Path(cmd.result_file).read_text())
                res.metrics.update(data.get("metrics", {}))
                if data.get("status") == "failed" and not timed_out:
                    res.status = "failed"
                    res.reason = data.get("reason", "")
            except (OSError, ValueError) as e:
                res.metrics["result_file_error"] = str(e)
        if timed_out:
            res.status = "timeout"
            res.reason = (
                f"stopped at the global deadline after {timeout:.0f} s"
                if deadline_bound
                else f"killed at its budget of {timeout:.0f} s"
            )
        elif res.status != "failed":
            if res.returncode == 0:
                res.status = "ok"
            else:
                res.status = "failed"
                res.reason = f"exit {res.returncode}: {last_error_line(text)}"
        if step.post:
            try:
                step.post(self.ctx, res)
            except Exception as e:
                res.metrics["post_error"] = f"{type(e).__name__}: {e}"

    def _append_log(self, name: str, text: str) -> None:
        self.ctx.log_path.parent.mkdir(parents=True, exist_ok=True)
        if len(text) > LOG_CAP_CHARS:
            text = (
                f"[... {len(text) - LOG_CAP_CHARS} chars cut ...]\n"
                + text[-LOG_CAP_CHARS:]
            )
        with open(self.ctx.log_path, "a", errors="replace") as f:
            f.write(f"\n===== {name} ({now_iso()}) =====\n{text}\n")


# -- reports -----------------------------------------------------------------------
# -- reports ---------------------------------------------------------------------------
def fmt(v: Any, digits: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if v != 0 and (abs(v) < 1e-2 or abs(v) >= 1e5):
            return f"{v:.2e}"
        return f"{v:.{digits}g}" if abs(v) < 1 else f"{v:.1f}"
    return str(v)


def fmt_ratio(v: Any) -> str:
    return "-" if v is None else f"{v:.2f}"


def cpu_bench_reference() -> dict[str, Any]:
    try:
        return bench_modes(json.loads(CPU_BENCH_JSON.read_text()))
    except (OSError, ValueError):
        return {}


def ratios(modes: dict[str, Any]) -> dict[str, float | None]:
    def tph(m):
        return (modes.get(m) or {}).get("train_steps_per_hour")

    out = {}
    for other in ("sync", "sequential"):
        a, b = tph("async"), tph(other)
        out[f"async_vs_{other}"] = (a / b) if a and b else None
    return out


def summary_rows(runner: Runner) -> list[list[str]]:
    """(measure, GPU value, CPU reference) rows for the table printed last."""
    res = {r.name: r for r in runner.results}
    rows: list[list[str]] = []
    bench = res.get("bench")
    gpu_modes = (bench.metrics.get("modes") if bench else None) or {}
    cpu_modes = cpu_bench_reference()
    for mode in ("async", "sync", "sequential"):
        g = (gpu_modes.get(mode) or {}).get("train_steps_per_hour")
        c = (cpu_modes.get(mode) or {}).get("train_steps_per_hour")
        rows.append([f"bench {mode}: train steps/h", fmt(g), fmt(c)])
    gr, cr = ratios(gpu_modes), ratios(cpu_modes)
    for k in ("async_vs_sync", "async_vs_sequential"):
        rows.append(
            [
                f"bench {k.replace('_', ' ')} (x)",
                fmt_ratio(gr.get(k)),
                fmt_ratio(cr.get(k)),
            ]
        )
    lp = res.get("logprob_agreement")
    for dt in ("bfloat16", "float32"):
        m = ((lp.metrics if lp else {}).get(dt)) or {}
        rows.append(
            [
                f"logprob gap vLLM-trainer, {dt} (mean |diff|)",
                fmt(m.get("mean_abs_diff")),
                fmt(CPU_LOGPROB_GAP[dt]),
            ]
        )
    m = (
        (lp.metrics if lp else {}).get("bfloat16")
        or (lp.metrics if lp else {}).get("float32")
        or {}
    )
    rows.append(
        ["adapter hot-swap, vLLM publish p50 (ms)", fmt(m.get("publish_ms_p50")), "-"]
    )
    tc = (res.get("trainer_cuda").metrics if res.get("trainer_cuda") else {}) or {}
    swap = tc.get("slot_swap") or {}
    rows.append(
        ["trainer LoRA slot swap p50 (ms)", fmt(swap.get("switch_ms_p50")), "-"]
    )
    st = tc.get("step_time") or {}
    for dt in ("bfloat16", "float32"):
        rows.append(
            [
                f"trainer step, {dt} (s, {st.get('model_kind', 'main')} model)",
                fmt((st.get(dt) or {}).get("step_s_p50")),
                "-",
            ]
        )
    mt = tc.get("multi_tenant") or {}
    rows.append(
        [
            f"trainer {mt.get('tenants', 8)} tenants round-robin / one task (steps/s)",
            fmt(mt.get("round_robin_over_one_task")),
            "-",
        ]
    )
    ta = tc.get("trained_adapter") or {}
    rows.append(
        [
            "trained adapter: engine vs PEFT, float32 (max |diff|)",
            fmt((ta.get("engine_float32_vs_peft_float32") or {}).get("max_abs_diff")),
            "-",
        ]
    )
    rows.append(
        [
            "trained adapter: bf16 engine vs float32 PEFT (mean |diff|)",
            fmt((ta.get("engine_bfloat16_vs_peft_float32") or {}).get("mean_abs_diff")),
            "-",
        ]
    )
    rep = tc.get("repeatability") or {}
    rows.append(
        [
            "same seed + batch -> same adapter (bitwise)",
            fmt(rep.get("same_seed_same_batch_bitwise_equal")),
            "-",
        ]
    )
    par = tc.get("parity") or {}
    for key in sorted(k for k, v in par.items() if isinstance(v, dict)):
        rows.append(
            [
                f"packed-attention parity {key} (max |diff|)",
                fmt(par[key].get("max_abs_diff")),
                "-",
            ]
        )
    qs = res.get("quickstart")
    if qs and qs.metrics:
        rows.append(
            [
                "quickstart wall (s) / train steps/h",
                f"{fmt(qs.metrics.get('wall_s'))} / "
                f"{fmt(qs.metrics.get('train_steps_per_hour'))}",
                "-",
            ]
        )
    return rows


def this_run(doc: dict[str, Any]) -> str:
    gpu = doc.get("gpu")
    return f"this run ({gpu['name']})" if gpu else "this run (CPU, no GPU)"


def safe_summary(runner: Runner) -> list[list[str]]:
    try:
        return summary_rows(runner)
    except Exception as e:  # unexpected metrics must not cost the report
        return [["summary could not be built", f"{type(e).__name__}: {e}", "-"]]


def render_table(rows: list[list[str]], header: list[str]) -> list[str]:
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    line = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True))  # noqa: E731
    return [line(header), line(["-" * w for w in widths])] + [line(r) for r in rows]


def md_table(rows: list[list[str]], header: list[str]) -> list[str]:
    esc = lambda c: str(c).replace("|", "\\|").replace("\n", " ")  # noqa: E731
    return ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)] + [
        "| " + " | ".join(esc(c) for c in r) + " |" for r in rows
    ]


def plan_rows(runner: Runner) -> list[dict[str, Any]]:
    rows = []
    for s in runner.steps:
        action, why = ("run", "")
        if s.preview:
            try:
                action, why = s.preview(runner.ctx)
            except Exception as e:
                action, why = "error", f"{type(e).__name__}: {e}"
        rows.append(
            {
                "name": s.name,
                "budget_s": s.budget_s,
                "in_deadline": s.in_deadline,
                "selected": s.selected,
                "what": s.what,
                "action": action,
                "why": why,
            }
        )
    return rows


def document(runner: Runner, dry_run: bool) -> dict[str, Any]:
    ctx = runner.ctx
    in_deadline = sum(s.budget_s for s in runner.steps if s.in_deadline and s.selected)
    return {
        "schema": SCHEMA,
        "dry_run": dry_run,
        "started": runner.started,
        "finished": runner.finished,
        "command": [sys.executable, *sys.argv],
        "deadline_s": runner.deadline_s,
        "budget_total_s": in_deadline,
        "elapsed_s": round(runner.clock() - runner.t0, 1),
        "machine": ctx.facts.get("machine"),
        "gpu": ctx.facts.get("gpu"),
        "gpu_why": ctx.facts.get("gpu_why"),
        "env": {k: v for k, v in ctx.facts.items() if k not in ("machine",)},
        "plan": getattr(runner, "plan", None) or plan_rows(runner),
        "steps": [asdict(r) for r in runner.results],
        "summary": safe_summary(runner),
    }


def write_reports(runner: Runner, dry_run: bool = False) -> dict[str, Any]:
    doc = document(runner, dry_run)
    out = runner.ctx.out
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / ".gpu_check.json.tmp"
    tmp.write_text(json.dumps(doc, indent=1, default=str))
    os.replace(tmp, out / "gpu_check.json")
    tmp = out / ".gpu_check.md.tmp"
    tmp.write_text(markdown(doc))
    os.replace(tmp, out / "gpu_check.md")
    return doc


def markdown(doc: dict[str, Any]) -> str:
    m = doc.get("machine") or {}
    gpu = doc.get("gpu")
    lines = [
        "# GPU check" + (" (dry run: plan only)" if doc["dry_run"] else ""),
        "",
        f"Started {doc['started']}, finished {doc['finished'] or '(running)'}; "
        f"deadline {doc['deadline_s']:.0f} s, "
        f"step budgets {doc['budget_total_s']:.0f} s, "
        f"elapsed {doc['elapsed_s']} s. Command: `{' '.join(doc['command'])}`",
        "",
        f"Machine: {m.get('arch')}, {m.get('cpus')} CPUs, {m.get('mem_gib')} GiB; "
        f"GPU: {json.dumps(gpu) if gpu else 'none (' + str(doc.get('gpu_why')) + ')'}; "
        f"nvidia-smi: {m.get('nvidia_smi') or '-'}; "
        f"checkout: {m.get('git_commit') or 'unknown'}",
        "",
    ]
    env = doc.get("env") or {}
    for kind in ("trainer", "vllm"):
        f = env.get(kind) or {}
        lines.append(
            f"* {kind}: "
            + (
                f"`{f.get('python')}` ({f.get('source')})"
                + (", with offline stubs for " + STUB_MODULES if f.get("stubs") else "")
                if f.get("ok")
                else f"none: {f.get('why')}"
            )
        )
    net = env.get("network") or {}
    lines.append(
        f"* package index: {'yes' if net.get('ok') else 'no'} ({net.get('why')})"
    )
    lines += ["", "## Plan", ""]
    lines += md_table(
        [
            [
                p["name"],
                f"{p['budget_s']:.0f}",
                "yes" if p["in_deadline"] else "no",
                p["action"],
                p["why"] or p["what"],
            ]
            for p in doc["plan"]
        ],
        ["step", "budget s", "in deadline", "action", "why / what"],
    )
    if not doc["dry_run"]:
        lines += ["", "## Steps", ""]
        lines += md_table(
            [
                [
                    s["name"],
                    s["status"],
                    fmt(s["elapsed_s"]),
                    f"{s['budget_s']:.0f}",
                    s["reason"],
                ]
                for s in doc["steps"]
            ],
            ["step", "status", "s", "budget s", "reason"],
        )
        lines += ["", "## Summary", ""]
        lines += md_table(doc["summary"], ["measure", this_run(doc), "CPU (docs)"])
        bad = [s for s in doc["steps"] if s["status"] in ("failed", "timeout")]
        if bad:
            lines += ["", "## What failed", ""]
            for s in bad:
                lines += [
                    f"### {s['name']}: {s['status']}",
                    "",
                    s["reason"],
                    "",
                    "```",
                    s["tail"][-2500:],
                    "```",
                    "",
                ]
        lines += ["", "## Metrics per step", ""]
        for s in doc["steps"]:
            if s["metrics"]:
                lines += [
                    f"### {s['name']}",
                    "",
                    "```json",
                    json.dumps(s["metrics"], indent=1, default=str)[:6000],
                    "```",
                    "",
                ]
    return "\n".join(lines) + "\n"


def print_summary(runner: Runner, doc: dict[str, Any]) -> None:
    print()
    gpu = doc.get("gpu")
    ok = sum(r.status == "ok" for r in runner.results)
    print(
        f"== GPU check: {gpu['name'] if gpu else 'no GPU'}"
        + (f", torch {gpu.get('torch')}" if gpu else "")
        + f"; {ok}/{len(runner.results)} steps ok in {doc['elapsed_s']} s "
        f"(deadline {runner.deadline_s:.0f} s) =="
    )
    for line in render_table(
        [
            [r.name, r.status, fmt(r.elapsed_s), f"{r.budget_s:.0f}", r.reason[:110]]
            for r in runner.results
        ],
        ["step", "status", "s", "budget", "reason"],
    ):
        print(line)
    print()
    for line in render_table(doc["summary"], ["measure", this_run(doc), "CPU (docs)"]):
        print(line)
    print(f"\nwrote {runner.ctx.out / 'gpu_check.json'} and gpu_check.md")


# -- main --------------------------------------------------------------------------
# -- main ------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="gpu_check.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--dry-run", action="store_true", help="plan + environment checks only"
    )
    ap.add_argument(
        "--out",
        default=None,
        help="results folder (default: $OUT, else runs/gpu_check; "
        "dry run: runs/gpu-check-dry)",
    )
    ap.add_argument(
        "--work",
        default=None,
        help="models, run dirs, logs (default: $MARLAAS_CACHE/gpu-check/work)",
    )
    ap.add_argument(
        "--deadline-s",
        type=float,
        default=DEFAULT_DEADLINE_S,
        help="global deadline of the timed steps",
    )
    ap.add_argument(
        "--budget",
        action="append",
        default=[],
        metavar="STEP=S",
        help="override a step budget",
    )
    ap.add_argument(
        "--only", default="", help="comma list of steps to run (+ setup, model)"
    )
    ap.add_argument("--skip", default="", help="comma list of steps to skip")
    ap.add_argument(
        "--wheelhouse", default=None, help="folder of wheels for an offline machine"
    )
    ap.add_argument("--offline", action="store_true", help="assume no package index")
    ap.add_argument("--online", action="store_true", help="assume a package index")
    ap.add_argument(
        "--no-build", action="store_true", help="never build venvs or the model"
    )
    ap.add_argument("--areal-python", default=None, help="trainer interpreter to use")
    ap.add_argument(
        "--vllm-python", default=None, help="vLLM server interpreter to use"
    )
    ap.add_argument(
        "--allow-cpu",
        action="store_true",
        help="run GPU steps on the CPU (testing the steps; implies --allow-no-gpu)",
    )
    ap.add_argument(
        "--allow-no-gpu",
        action="store_true",
        help="run without a GPU (developing this script: the GPU steps are "
        "skipped); without it a machine with no GPU is refused, and "
        "`make gpu-check-dry` is the check to run there",
    )
    ap.add_argument(
        "--shaped-random",
        action="store_true",
        help="use the random SmolLM2-shaped model even if the real one exists",
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="trainer_cuda: fewer steps, tiny model (CPU tests)",
    )
    ap.add_argument(
        "--vllm-eager",
        type=lambda s: s.lower() in ("1", "true", "yes"),
        default=True,
        help="vLLM enforce_eager (default true: starts in seconds, no compile/graphs)",
    )
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    ap.add_argument("--bench-tenants", type=int, default=8)
    ap.add_argument("--bench-steps", type=int, default=2)
    ap.add_argument(
        "--bench-arg", action="append", default=[], help="extra marlaas bench override"
    )
    ap.add_argument(
        "--quickstart-arg",
        action="append",
        default=[],
        help="extra marlaas train override",
    )
    ap.add_argument(
        "--fetch-wheels",
        default=None,
        metavar="DIR",
        help="download requirements/gpu-offline.txt's wheels for an offline "
        "machine, then exit",
    )
    ap.add_argument(
        "--python-version",
        default="3.12",
        help="--fetch-wheels: target CPython (default 3.12)",
    )
    ap.add_argument("--_internal", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--_ctx", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.out is None:
        if os.environ.get("OUT"):
            args.out = os.environ["OUT"]
        elif args.dry_run:
            args.out = str(REPO / "runs" / "gpu-check-dry")
        else:
            args.out = str(DEFAULT_OUT)
    args.out_resolved = str(Path(args.out).resolve())
    if args.wheelhouse:
        args.wheelhouse = str(Path(args.wheelhouse).resolve())
    return args


def apply_selection(steps: list[Step], args: argparse.Namespace) -> list[Step]:
    names = {s.name for s in steps}
    for spec in args.budget:
        name, _, sec = spec.partition("=")
        if name not in names:
            raise SystemExit(
                f"--budget: unknown step {name!r} (steps: {sorted(names)})"
            )
        for s in steps:
            if s.name == name:
                s.budget_s = float(sec)
    only = {x for x in args.only.split(",") if x}
    skip = {x for x in args.skip.split(",") if x}
    for bad in (only | skip) - names:
        raise SystemExit(f"unknown step {bad!r} (steps: {sorted(names)})")
    for s in steps:
        # setup and model feed every later step: --only keeps them (--skip does not).
        if (only and s.name not in only | {"setup", "model"}) or s.name in skip:
            reason = "not selected (--only/--skip)"
            s.selected = False
            s.command = lambda ctx, r=reason: Skip(r)
            s.preview = lambda ctx, r=reason: ("skip", r)
    return steps


def validate_plan(steps: list[Step], deadline_s: float) -> list[str]:
    errors = []
    names = [s.name for s in steps]
    if len(set(names)) != len(names):
        errors.append(f"duplicate step names: {names}")
    for s in steps:
        if not s.budget_s > 0:
            errors.append(f"{s.name}: budget must be > 0, got {s.budget_s}")
    total = sum(s.budget_s for s in steps if s.in_deadline and s.selected)
    if total > deadline_s:
        errors.append(
            f"in-deadline budgets sum to {total:.0f} s > deadline {deadline_s:.0f} s"
        )
    return errors


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.fetch_wheels:
        return fetch_wheels(args.fetch_wheels, args.python_version)
    if args._internal:
        ctx = load_internal_ctx(args._ctx)
        return INTERNAL[args._internal](ctx)
    out = Path(args.out_resolved)
    work = Path(args.work or cache_dir() / "gpu-check" / "work").resolve()
    ctx = Ctx(args=args, out=out, work=work)
    steps = apply_selection(make_steps(), args)
    errors = validate_plan(steps, args.deadline_s)
    machine = None
    if not args.dry_run:
        # Before anything is written: a CPU run's files would read like a GPU result.
        machine = machine_facts()
        if not (gpu_listed(machine) or args.allow_no_gpu or args.allow_cpu):
            print(no_gpu_message(machine), file=sys.stderr)
            return EXIT_NO_GPU
    work.mkdir(parents=True, exist_ok=True)
    if args.dry_run:
        return dry_run(ctx, steps, errors)
    if errors:
        print("plan is not well-formed:\n  " + "\n  ".join(errors), file=sys.stderr)
        return 2
    if (out / "gpu_check.log").exists():
        (out / "gpu_check.log").unlink()
    # Cheap facts first, so the build step knows what is missing.
    ctx.facts["machine"] = machine
    ctx.facts["network"] = network_ok(sys.executable, args)
    signal.signal(signal.SIGTERM, _sigterm)
    runner = Runner(steps, ctx, args.deadline_s, report=lambda r: write_reports(r))
    runner.plan = plan_rows(runner)
    print_plan(runner.plan, args.deadline_s)
    try:
        runner.run()
    except KeyboardInterrupt:
        print("[gpu-check] interrupted: the running step was stopped", flush=True)
        print_summary(runner, write_reports(runner))
        return 130
    doc = write_reports(runner)
    print_summary(runner, doc)
    return 0


def no_gpu_message(machine: dict[str, Any]) -> str:
    smi = (machine.get("nvidia_smi") or "absent")[:200]
    dev = "present" if machine.get("dev_nvidia0") else "absent"
    return (
        f"[gpu-check] no GPU here (nvidia-smi: {smi}, /dev/nvidia0: {dev}): not "
        "running, since its files would read like a GPU result. Use `make "
        "gpu-check-dry` (scripts/gpu_check.py --dry-run) to check the plan and the "
        "environment without a GPU; --allow-no-gpu runs it anyway (developing this "
        "script)."
    )


def _sigterm(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def print_plan(plan: list[dict[str, Any]], deadline_s: float) -> None:
    rows = [
        [
            p["name"],
            f"{p['budget_s']:.0f}",
            "yes" if p["in_deadline"] else "no (own)",
            p["action"],
            (p["why"] or p["what"])[:150],
        ]
        for p in plan
    ]
    for line in render_table(
        rows, ["step", "budget s", "in deadline", "action", "why / what"]
    ):
        print(line)
    total = sum(p["budget_s"] for p in plan if p["in_deadline"] and p["selected"])
    print(
        f"in-deadline budgets: {total:.0f} s of the {deadline_s:.0f} s deadline",
        flush=True,
    )


def dry_run(ctx: Ctx, steps: list[Step], errors: list[str]) -> int:
    print(
        "[gpu-check] dry run: plan and environment checks (no GPU needed)", flush=True
    )
    gather_facts(ctx, full=False)
    runner = Runner(steps, ctx, ctx.args.deadline_s, report=lambda r: None)
    for r in runner.results:
        r.status = "skipped"
        r.reason = "dry run"
    runner.plan = plan_rows(runner)
    runner.finished = now_iso()
    write_reports(runner, dry_run=True)
    m = ctx.facts["machine"]
    print(
        f"machine: {m['arch']}, {m['cpus']} CPUs, {m.get('mem_gib')} GiB, "
        f"cache disk free {m['disk_free_gib_cache']} GiB, "
        f"nvidia-smi: {m.get('nvidia_smi') or 'absent'}"
    )
    print(f"gpu: {ctx.facts['gpu'] or ctx.facts['gpu_why']}")
    for kind in ("trainer", "vllm"):
        f = ctx.facts[kind]
        print(
            f"{kind} python: "
            + (f"{f['python']} ({f['source']})" if f["ok"] else f"none: {f['why']}")
            + (f" [{f['unverified']}]" if f.get("unverified") else "")
        )
    print(
        f"package index: {ctx.facts['network']['why']}; "
        f"wheelhouse: {len(ctx.facts['wheelhouse'])} wheels"
    )
    print_plan(runner.plan, ctx.args.deadline_s)
    for e in errors:
        print(f"PLAN ERROR: {e}")
    print(f"wrote {ctx.out / 'gpu_check.json'} and gpu_check.md")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
