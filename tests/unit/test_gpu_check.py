"""scripts/gpu_check.py on the CPU: the dry run's plan, and the runner's time limits
(a step over its budget is killed, the global deadline stops the rest cleanly, the
report files are written either way, nothing it started outlives it)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.procs import alive

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_check.py"
STEP_ORDER = [
    "build",
    "setup",
    "model",
    "trainer_cuda",
    "rollout_multilora",
    "logprob_agreement",
    "quickstart",
    "bench",
]


def _load():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = mod
    spec.loader.exec_module(mod)
    return mod


gc = _load()


def sleeper(name, budget, secs, rc=0, in_deadline=True):
    code = (
        f"import sys, time; print('{name} start', flush=True); time.sleep({secs}); "
        f"print('{name} done', flush=True); sys.exit({rc})"
    )
    cmd = gc.Command([sys.executable, "-c", code])
    return gc.Step(
        name, budget, f"sleep {secs}", lambda ctx: cmd, in_deadline=in_deadline
    )


def run(steps, tmp_path, deadline, reserve=0.5, min_start=1.0):
    args = gc.parse_args(["--out", str(tmp_path / "out")])
    ctx = gc.Ctx(args=args, out=tmp_path / "out", work=tmp_path / "work")
    ctx.work.mkdir()
    runner = gc.Runner(
        steps,
        ctx,
        deadline,
        report=gc.write_reports,
        reserve_s=reserve,
        min_start_s=min_start,
    )
    runner.run()
    doc = json.loads((ctx.out / "gpu_check.json").read_text())
    return doc, {s["name"]: s for s in doc["steps"]}


def test_step_over_its_budget_is_killed_and_the_next_step_runs(tmp_path):
    # A 3 s budget: the child prints its start within ~0.1 s here.
    doc, steps = run(
        [sleeper("slow", 3.0, 60), sleeper("next", 10, 0.1)], tmp_path, deadline=60
    )

    slow = steps["slow"]
    assert slow["status"] == "timeout" and slow["timeout_s"] == 3.0
    assert "budget of 3 s" in slow["reason"]
    # Killed at its limit (~3.0 s here), not after the child's 60 s.
    assert 3.0 <= slow["elapsed_s"] < 30
    assert "slow start" in slow["tail"] and "slow done" not in slow["tail"]
    assert steps["next"]["status"] == "ok"


def test_global_deadline_stops_the_rest_and_the_files_are_still_written(tmp_path):
    # "a" (~0.3 s with its interpreter) leaves "b" the rest of the 6 s deadline
    # less the 0.5 s reserve; "b" would be skipped only if "a" took 4.5 s.
    doc, steps = run(
        [sleeper("a", 10, 0.2), sleeper("b", 60, 60), sleeper("c", 10, 0.1)],
        tmp_path,
        deadline=6,
    )

    assert steps["a"]["status"] == "ok"
    assert steps["b"]["status"] == "timeout"
    assert "global deadline" in steps["b"]["reason"]
    # Its limit was what the deadline left (~5.2 s here), not its own 60 s budget.
    assert steps["b"]["timeout_s"] <= 5.5 and steps["b"]["elapsed_s"] < 30
    assert steps["c"]["status"] == "skipped"
    assert "global deadline" in steps["c"]["reason"]
    assert doc["finished"] is not None
    md = (tmp_path / "out" / "gpu_check.md").read_text()
    assert "| b | timeout |" in md and "## What failed" in md


def test_steps_outside_the_deadline_do_not_start_its_clock(tmp_path):
    doc, steps = run(
        [sleeper("build", 10, 3.0, in_deadline=False), sleeper("a", 10, 0.1)],
        tmp_path,
        deadline=4.0,
        min_start=0.6,
    )

    assert steps["build"]["status"] == "ok"
    # The deadline's 4 s started after the build's 3 s: "a" got all of it but
    # the reserve (a clock started with the build would have skipped it).
    assert steps["a"]["status"] == "ok" and steps["a"]["timeout_s"] == 3.5


def test_failed_step_is_recorded_with_its_error_and_the_next_runs(tmp_path):
    code = "raise RuntimeError('CUDA error: no kernel image is available')"
    bad = gc.Step(
        "bad", 10, "fails", lambda ctx: gc.Command([sys.executable, "-c", code])
    )
    doc, steps = run([bad, sleeper("next", 10, 0.1)], tmp_path, deadline=60)

    assert steps["bad"]["status"] == "failed"
    assert steps["bad"]["returncode"] == 1
    assert "no kernel image" in steps["bad"]["reason"]
    assert steps["next"]["status"] == "ok"


def test_skip_records_the_reason_and_starts_nothing(tmp_path):
    skip = gc.Step("vllm", 10, "x", lambda ctx: gc.Skip("vllm not importable"))
    doc, steps = run([skip], tmp_path, deadline=60)

    assert steps["vllm"]["status"] == "skipped"
    assert steps["vllm"]["reason"] == "vllm not importable"
    assert steps["vllm"]["elapsed_s"] is None


def test_result_file_metrics_are_kept_even_when_the_step_times_out(tmp_path):
    result = tmp_path / "r.json"
    code = (
        "import json, os, time; "
        "open(os.environ['GPU_CHECK_RESULT'], 'w').write("
        "json.dumps({'metrics': {'parity': {'max_abs_diff': 1e-6}}})); time.sleep(60)"
    )
    step = gc.Step(
        "part",
        3.0,  # the child writes its result within ~0.1 s here
        "x",
        lambda ctx: gc.Command([sys.executable, "-c", code], result_file=str(result)),
    )
    doc, steps = run([step], tmp_path, deadline=60)

    assert steps["part"]["status"] == "timeout"
    assert steps["part"]["metrics"]["parity"]["max_abs_diff"] == 1e-6


def test_processes_a_step_started_in_new_sessions_are_ended(tmp_path):
    pidfile = tmp_path / "pid"
    code = (
        "import subprocess, sys, time; "
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], "
        "start_new_session=True); "
        f"open({str(pidfile)!r}, 'w').write(str(p.pid)); time.sleep(0.5)"
    )
    step = gc.Step(
        "orphans", 10, "x", lambda ctx: gc.Command([sys.executable, "-c", code])
    )
    doc, steps = run([step], tmp_path, deadline=60)

    pid = int(pidfile.read_text())
    assert steps["orphans"]["status"] == "ok"
    assert pid in steps["orphans"]["reaped_pids"]
    assert not alive(pid)


def test_plan_validation_rejects_budgets_over_the_deadline():
    steps = gc.make_steps()
    assert gc.validate_plan(steps, gc.DEFAULT_DEADLINE_S) == []
    errors = gc.validate_plan(steps, 100)
    assert errors and "> deadline 100 s" in errors[0]


def test_summary_ratios_and_junit():
    modes = {
        "async": {"train_steps_per_hour": 300.0},
        "sync": {"train_steps_per_hour": 200.0},
        "sequential": {"train_steps_per_hour": 100.0},
    }
    assert gc.ratios(modes) == {"async_vs_sync": 1.5, "async_vs_sequential": 3.0}
    assert gc.ratios({}) == {"async_vs_sync": None, "async_vs_sequential": None}


def test_dry_run_plan_is_well_formed(tmp_path):
    p = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,  # works from anywhere
    )

    assert p.returncode == 0, p.stdout + p.stderr
    doc = json.loads((tmp_path / "gpu_check.json").read_text())
    assert doc["dry_run"] is True and doc["schema"] == 1
    plan = doc["plan"]
    assert [row["name"] for row in plan] == STEP_ORDER
    for row in plan:
        assert row["budget_s"] > 0
        assert row["action"] in ("run", "skip"), row
        if row["action"] == "skip":
            assert row["why"], row
    timed = [row for row in plan if row["in_deadline"]]
    assert [row["name"] for row in plan if not row["in_deadline"]] == ["build"]
    assert sum(row["budget_s"] for row in timed) <= doc["deadline_s"]
    assert doc["budget_total_s"] == sum(row["budget_s"] for row in timed)
    # The environment checks ran: machine facts and a verdict per interpreter.
    assert doc["machine"]["cpus"] >= 1 and "disk_free_gib_cache" in doc["machine"]
    for kind in ("trainer", "vllm"):
        assert isinstance(doc["env"][kind]["ok"], bool)
        assert doc["env"][kind]["ok"] or doc["env"][kind]["why"]
    if doc["gpu"] is None:
        gpu_steps = [r for r in plan if r["name"] not in ("build", "setup", "model")]
        assert all(r["action"] == "skip" for r in gpu_steps)
        assert all("GPU" in r["why"] or "CUDA" in r["why"] for r in gpu_steps)
    assert "## Plan" in (tmp_path / "gpu_check.md").read_text()
    # The plan table is in the output, budgets included.
    assert "trainer_cuda" in p.stdout and "in-deadline budgets:" in p.stdout


@pytest.mark.parametrize("bad", [["--budget", "nope=3"], ["--only", "nope"]])
def test_unknown_step_names_are_refused(bad, tmp_path):
    p = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run", "--out", str(tmp_path), *bad],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode != 0 and "unknown step" in p.stderr


def test_sigterm_to_the_runner_stops_the_running_step_and_writes_the_files(tmp_path):
    pidfile, out = tmp_path / "pid", tmp_path / "out"
    step_code = (
        f"import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); "
        "time.sleep(120)"
    )
    code = f"""
import signal, sys
sys.path.insert(0, {str(SCRIPT.parent)!r})
import gpu_check as gc
cmd = gc.Command([sys.executable, "-c", {step_code!r}])
step = gc.Step("long", 100, "x", lambda ctx: cmd)
args = gc.parse_args(["--out", {str(out)!r}])
ctx = gc.Ctx(args=args, out=gc.Path({str(out)!r}), work=gc.Path({str(tmp_path)!r}))
signal.signal(signal.SIGTERM, gc._sigterm)
runner = gc.Runner([step], ctx, 200, report=gc.write_reports)
try:
    runner.run()
except KeyboardInterrupt:
    sys.exit(130)
"""
    proc = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.monotonic() + 30
    while not pidfile.exists() or not pidfile.read_text():
        assert time.monotonic() < deadline, "the step never started"
        time.sleep(0.1)
    proc.terminate()

    assert proc.wait(30) == 130
    assert not alive(int(pidfile.read_text()))
    doc = json.loads((out / "gpu_check.json").read_text())
    assert doc["steps"][0]["status"] == "failed"
    assert "interrupted" in doc["steps"][0]["reason"]


NO_GPU = {"nvidia_smi": None, "dev_nvidia0": False}
ALL_BUT_BUILD = (
    "setup,model,trainer_cuda,rollout_multilora,logprob_agreement,quickstart,bench"
)


def test_a_gpu_is_what_nvidia_smi_lists_or_the_device_node():
    h200 = "NVIDIA H200, 143771 MiB, 570.86.15, 9.0"
    assert gc.gpu_listed({"nvidia_smi": h200, "dev_nvidia0": True})
    assert gc.gpu_listed({"nvidia_smi": None, "dev_nvidia0": True})
    assert not gc.gpu_listed(NO_GPU)
    broken = "NVIDIA-SMI has failed because it couldn't communicate with the driver"
    assert not gc.gpu_listed({"nvidia_smi": broken, "dev_nvidia0": False})


def test_the_real_run_without_a_gpu_refuses_before_writing(
    tmp_path, monkeypatch, capsys
):
    # In-process with the machine facts of a GPU-less box: runs on any machine.
    monkeypatch.setattr(gc, "machine_facts", lambda: dict(NO_GPU))
    monkeypatch.setenv("MARLAAS_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("OUT", raising=False)
    out = tmp_path / "out"

    rc = gc.main(["--out", str(out), "--offline"])

    assert rc == gc.EXIT_NO_GPU != 0
    assert "make gpu-check-dry" in capsys.readouterr().err
    assert not out.exists() and not (tmp_path / "cache").exists()


def _files(root: Path) -> dict[str, int]:
    return {
        str(p.relative_to(root)): p.stat().st_mtime_ns
        for p in root.rglob("*")
        if p.is_file()
    }


def _gpu_less_copy(tmp_path: Path) -> Path:
    """The script, its steps and the Makefile in a repository-shaped folder."""
    if gc.gpu_listed(gc.machine_facts()):
        pytest.skip("this machine has a GPU")
    copy = tmp_path / "repo"
    shutil.copytree(
        REPO / "scripts" / "gpu_check_steps",
        copy / "scripts" / "gpu_check_steps",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    shutil.copy(SCRIPT, copy / "scripts" / "gpu_check.py")
    shutil.copy(REPO / "Makefile", copy / "Makefile")
    (copy / "docs" / "results" / "gpu").mkdir(parents=True)
    return copy


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    env["MARLAAS_CACHE"] = str(tmp_path / "cache")
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # so that "nothing written" is exact
    return env


@pytest.mark.parametrize("via", ["make", "script"])
def test_make_gpu_check_without_a_gpu_refuses_and_writes_nothing(via, tmp_path):
    copy = _gpu_less_copy(tmp_path)
    if via == "make":
        if not shutil.which("make"):
            pytest.skip("no make")
        argv = ["make", "-s", "gpu-check", f"GPU_CHECK_PYTHON={sys.executable}"]
    else:
        argv = [sys.executable, "scripts/gpu_check.py"]
    before = _files(copy)

    p = subprocess.run(
        argv, cwd=copy, env=_env(tmp_path), capture_output=True, text=True, timeout=60
    )

    assert p.returncode != 0, p.stdout + p.stderr
    assert "make gpu-check-dry" in p.stderr
    assert _files(copy) == before  # nothing under docs/, runs/ or anywhere else
    assert not (tmp_path / "cache").exists()


def test_allow_no_gpu_runs_without_a_gpu_into_the_ignored_default(tmp_path):
    copy = _gpu_less_copy(tmp_path)
    p = subprocess.run(
        [sys.executable, "scripts/gpu_check.py", "--allow-no-gpu", "--offline"]
        + ["--skip", ALL_BUT_BUILD],
        cwd=copy,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert p.returncode == 0, p.stdout + p.stderr
    doc = json.loads((copy / "runs" / "gpu_check" / "gpu_check.json").read_text())
    assert doc["machine"]["nvidia_smi"] is None and doc["gpu"] is None
    assert not any((copy / "docs" / "results" / "gpu").iterdir())


def test_results_default_to_ignored_folders_not_docs(monkeypatch):
    monkeypatch.delenv("OUT", raising=False)
    ignored = (REPO / ".gitignore").read_text().splitlines()
    assert "/runs/" in ignored
    for argv, folder in (([], "gpu_check"), (["--dry-run"], "gpu-check-dry")):
        out = Path(gc.parse_args(argv).out)
        assert out == REPO / "runs" / folder, argv
    monkeypatch.setenv("OUT", "/tmp/device-out")
    assert gc.parse_args([]).out == "/tmp/device-out"
    help_text = subprocess.run(
        [sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True
    ).stdout
    assert "--allow-no-gpu" in help_text and "make gpu-check-dry" in help_text
