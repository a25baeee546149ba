"""Run tenant python graders where they cannot reach the network, other tenants'
data or the service.

One grading batch = one sandbox process tree (``_sandbox_child.py``), started
with ``python -I -S`` (isolated mode, no site: the standard library only; numpy
and other packages are NOT available to graders) and a minimal environment (no
service variables or keys). Inside it:

* network: a new network namespace with only a down loopback, so no connection
  leaves it, not even to 127.0.0.1 (the host's loopback is another namespace);
* filesystem: a new mount namespace whose root is a read-only tmpfs holding
  read-only bind mounts of ``/usr`` (with the ``/bin``, ``/lib*`` symlinks), the
  interpreter's prefix (``sys.base_prefix``, e.g. pyenv's under /root),
  ``/dev/{null,zero,random,urandom}`` and ``/etc/ld.so.cache``; the old root is
  detached (``pivot_root``), so the service root and every tenant's files are
  invisible. Keep service and tenant data out of /usr and the interpreter prefix;
* processes: a new PID namespace (the grader cannot see or signal any other
  process, other sandboxes included) and IPC namespace;
* identity: as root, uid/gid 65534 with no supplementary groups; as non-root, a
  user namespace mapping the caller to 0 with every capability dropped; in both,
  ``no_new_privs``;
* limits (``SandboxLimits``): RLIMIT_AS (memory), RLIMIT_CPU (per pair, re-armed
  before each), RLIMIT_FSIZE 0 (no file writes), RLIMIT_NOFILE, RLIMIT_NPROC 0
  (no processes or threads), RLIMIT_CORE 0, and a wall-time deadline per pair
  enforced here by killing the whole process group; the tree also dies with the
  service (``PR_SET_PDEATHSIG``).

If the namespaces cannot be created (no root and no unprivileged user
namespaces), python graders are refused: ``sandbox_status()`` says why and
``check_grader`` turns it into a validation error. Nothing ever falls back to an
unisolated run.

A pair that raises, returns a non-number, or is killed (wall time, CPU,
memory) scores 0 with the reason; the pairs after a killed one are graded in a
fresh sandbox, and pairs before it keep their scores.

Overhead per sample, median of 9 repeats (``PYTHONPATH=$PWD python
scripts/graders_overhead.py --repeats 9``; 2-core Intel Xeon VM, Python 3.11.7,
as root, shared with other test runs: load average 8.7 at the time)::

    string_check, batch 1      0.36 ms    string_check, batch 32    0.026 ms
    python,       batch 1       187 ms    python,       batch 32     4.8 ms

A sandbox costs one interpreter start plus namespace and mount setup (about
30 ms on an idle machine), which a batch amortizes: grade a step's samples with
``grade_batch``, not one by one.
"""

from __future__ import annotations

import json
import math
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from areal.utils import logging

from areal_marlaas.procs import stop_group

logger = logging.getLogger("MARLaaSGraders")

CHILD = Path(__file__).with_name("_sandbox_child.py")
DEV_FILES = ("/dev/null", "/dev/zero", "/dev/random", "/dev/urandom")
_PROTO_LINE_MAX = 1 << 20


@dataclass
class SandboxLimits:
    wall_s: float = field(
        default=120.0,
        metadata={"help": "Wall time per graded sample (OpenAI's documented 2 min)."},
    )
    cpu_s: float = field(
        default=60.0, metadata={"help": "CPU seconds per graded sample (RLIMIT_CPU)."}
    )
    memory_mb: int = field(
        default=512, metadata={"help": "Address-space limit of a sandbox (RLIMIT_AS)."}
    )
    open_files: int = field(
        default=64, metadata={"help": "Open file descriptors (RLIMIT_NOFILE)."}
    )
    startup_s: float = field(
        default=10.0,
        metadata={"help": "Extra wall time to start the sandbox and load the source."},
    )
    output_bytes: int = field(
        default=8192,
        metadata={"help": "Captured stdout and stderr kept per batch (each)."},
    )
    source_max_bytes: int = field(
        default=256 * 1024,
        metadata={"help": "Largest python grader source (OpenAI's 256 kB)."},
    )
    uid: int = field(
        default=65534,
        metadata={"help": "Unprivileged uid/gid graders run as when started as root."},
    )

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict | None) -> SandboxLimits:
        known = {f.name for f in fields(cls)}
        unknown = set(d or {}) - known
        if unknown:
            raise ValueError(f"unknown SandboxLimits fields: {sorted(unknown)}")
        return cls(**(d or {}))


@dataclass
class SampleOutcome:
    score: float = 0.0
    # "" (graded), "runtime" (raised / returned a non-number), "timeout",
    # "cpu", "memory", "killed", "server" (the sandbox itself failed).
    kind: str = ""
    reason: str = ""
    seconds: float = 0.0


@dataclass
class BatchOutcome:
    samples: list[SampleOutcome]
    stdout: str = ""
    stderr: str = ""
    sandboxes: int = 0  # processes started (1 unless a sample was killed)
    seconds: float = 0.0


class SandboxUnavailable(RuntimeError):
    pass


def base_python() -> str:
    """The interpreter without the venv: the sandbox sees no site-packages."""
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def mount_plan() -> dict:
    """What the sandbox root exposes (read-only)."""
    exe = base_python()
    prefix = os.path.realpath(sys.base_prefix)
    dirs = ["/usr"]
    for extra in (prefix, os.path.dirname(exe)):
        if not any(_under(extra, d) for d in dirs):
            dirs.append(extra)
    symlinks, more = [], []
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            symlinks.append(top)
        elif os.path.isdir(top):
            more.append(top)  # not a merged-/usr system: expose it too
    files = [*DEV_FILES, "/etc/ld.so.cache"]
    return {"bind_dirs": dirs + more, "bind_files": files, "symlinks": symlinks}


def _decode(buf: bytearray) -> str:
    return bytes(buf).decode("utf-8", "replace")


def _exit_reason(exit_info: dict | None, limits: SandboxLimits) -> tuple[str, str]:
    if exit_info is None:
        return "killed", "the sandbox process died without reporting"
    code = exit_info.get("code")
    cpu = exit_info.get("cpu_s", 0.0)
    if code in (-signal.SIGXCPU, -signal.SIGKILL) and cpu >= limits.cpu_s - 0.5:
        return "cpu", f"CPU time limit exceeded ({limits.cpu_s:g} s per sample)"
    if code == -signal.SIGKILL:
        return "memory", (
            f"killed (SIGKILL), most likely over the {limits.memory_mb} MiB memory "
            "limit"
        )
    if isinstance(code, int) and code < 0:
        return "killed", f"killed by signal {signal.Signals(-code).name}"
    return "killed", f"the grader process exited early (status {code})"


class _Run:
    """One sandbox process over some pairs; fills ``done`` as results arrive."""

    def __init__(self, source: str, pairs: list, limits: SandboxLimits):
        self.source, self.pairs, self.limits = source, pairs, limits
        self.done: dict[int, SampleOutcome] = {}
        self.load_error: str | None = None
        self.setup_error: str | None = None
        self.failure: tuple[str, str] | None = None  # (kind, reason) of the kill
        self.exit_info: dict | None = None
        self.out, self.err = bytearray(), bytearray()
        self.ready = False

    def _job(self, proto_fd: int) -> bytes:
        cfg = {
            **mount_plan(),
            "proto_fd": proto_fd,  # pass_fds keeps the number
            "parent_pid": os.getpid(),
            "cpu_s": self.limits.cpu_s,
            "memory_mb": self.limits.memory_mb,
            "open_files": self.limits.open_files,
            "uid": self.limits.uid,
        }
        job = {"config": cfg, "source": self.source, "pairs": self.pairs}
        return json.dumps(job, ensure_ascii=False).encode("utf-8")

    def _handle(self, msg: dict) -> None:
        if "setup_error" in msg:
            self.setup_error = str(msg["setup_error"])
        elif "load_error" in msg:
            self.load_error = str(msg["load_error"])
        elif "ready" in msg:
            self.ready = True
        elif "exit" in msg and isinstance(msg["exit"], dict):
            # The first report is about the process that ran the tenant.
            self.exit_info = self.exit_info or msg["exit"]
        elif isinstance(msg.get("i"), int) and 0 <= msg["i"] < len(self.pairs):
            self.done[msg["i"]] = _outcome(msg)

    def run(self) -> None:
        proto_r, proto_w = os.pipe()
        job = self._job(proto_w)
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
        try:
            proc = subprocess.Popen(
                [base_python(), "-I", "-S", str(CHILD)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(proto_w,),
                env=env,
                cwd="/",
                start_new_session=True,  # its own process group, killed as one
            )
        finally:
            os.close(proto_w)
        try:
            self._pump(proc, job, proto_r)
        finally:
            os.close(proto_r)
            _kill_group(proc)

    def _pump(self, proc, job: bytes, proto_r: int) -> None:
        limits = self.limits
        sel = selectors.DefaultSelector()
        os.set_blocking(proc.stdin.fileno(), False)
        sel.register(proc.stdin, selectors.EVENT_WRITE, "in")
        sel.register(proc.stdout, selectors.EVENT_READ, "out")
        sel.register(proc.stderr, selectors.EVENT_READ, "err")
        sel.register(proto_r, selectors.EVENT_READ, "proto")
        view, line = memoryview(job), bytearray()
        deadline = time.monotonic() + limits.startup_s + limits.wall_s
        seen = 0
        while sel.get_map():
            timeout = deadline - time.monotonic()
            if timeout <= 0:
                self.failure = (
                    "timeout",
                    f"wall time limit exceeded ({limits.wall_s:g} s per sample)",
                )
                return
            for key, _ in sel.select(timeout):
                tag = key.data
                if tag == "in":
                    try:
                        n = os.write(proc.stdin.fileno(), view[:65536])
                        view = view[n:]
                    except (BrokenPipeError, BlockingIOError) as e:
                        if isinstance(e, BlockingIOError):
                            continue
                        view = view[:0]
                    if not len(view):
                        sel.unregister(proc.stdin)
                        proc.stdin.close()
                    continue
                fd = key.fd
                chunk = os.read(fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                if tag in ("out", "err"):
                    buf = self.out if tag == "out" else self.err
                    room = limits.output_bytes - len(buf)
                    if room > 0:
                        buf += chunk[:room]
                    continue
                line += chunk
                if len(line) > _PROTO_LINE_MAX and b"\n" not in line:
                    self.failure = ("killed", "the grader flooded its result channel")
                    return
                *complete, rest = bytes(line).split(b"\n")
                line = bytearray(rest)
                for raw in complete:
                    try:
                        msg = json.loads(raw)
                    except ValueError:
                        continue
                    if isinstance(msg, dict):
                        self._handle(msg)
                if len(self.done) + (1 if self.ready else 0) != seen:
                    # Progress: the next sample gets a fresh wall-time budget.
                    seen = len(self.done) + (1 if self.ready else 0)
                    deadline = time.monotonic() + limits.wall_s
        proc.wait()


def _outcome(msg: dict) -> SampleOutcome:
    t = float(msg.get("t") or 0.0)
    if "error" in msg:
        return SampleOutcome(0.0, "runtime", f"grade() raised:\n{msg['error']}", t)
    if "bad" in msg:
        return SampleOutcome(
            0.0, "runtime", f"grade() returned {msg['bad']}, not a number", t
        )
    score = msg.get("score")
    if not isinstance(score, int | float) or not math.isfinite(score):
        return SampleOutcome(0.0, "runtime", f"grade() returned {score}", t)
    return SampleOutcome(float(score), "", "", t)


def _kill_group(proc: subprocess.Popen) -> None:
    stop_group(proc, timeout=10, graceful=False)
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        try:
            if stream is not None:
                stream.close()
        except OSError:
            pass


def run_python_batch(
    source: str, pairs: list[tuple[dict, dict]], limits: SandboxLimits | None = None
) -> BatchOutcome:
    """Grade every (sample, item) pair with ``source``'s ``grade`` in one sandbox
    (a fresh one after a sample is killed). Never raises for tenant errors."""
    limits = limits or SandboxLimits()
    start = time.monotonic()
    n = len(pairs)
    results: list[SampleOutcome | None] = [None] * n
    out = BatchOutcome(samples=[])
    size = len(source.encode("utf-8"))
    if size > limits.source_max_bytes:
        reason = f"source is {size} bytes; the limit is {limits.source_max_bytes}"
        out.samples = [SampleOutcome(0.0, "server", reason) for _ in pairs]
        return out
    pending = list(range(n))
    while pending:
        run = _Run(source, [list(pairs[i]) for i in pending], limits)
        out.sandboxes += 1
        try:
            run.run()
        except OSError as e:
            run.setup_error = f"cannot start the sandbox: {e}"
        out.stdout += _decode(run.out)
        out.stderr += _decode(run.err)
        if run.setup_error or run.load_error:
            kind = "server" if run.setup_error else "runtime"
            reason = (
                f"sandbox unavailable: {run.setup_error}"
                if run.setup_error
                else f"the grader source failed to load:\n{run.load_error}"
            )
            for i in pending:
                results[i] = SampleOutcome(0.0, kind, reason)
            break
        for local, outcome in run.done.items():
            results[pending[local]] = outcome
        rest = [i for local, i in enumerate(pending) if local not in run.done]
        if not rest:
            break
        # The first ungraded pair is the one that was running when it ended.
        kind, reason = run.failure or _exit_reason(run.exit_info, limits)
        if not run.ready:
            for i in rest:
                results[i] = SampleOutcome(0.0, kind, f"while loading: {reason}")
            break
        results[rest[0]] = SampleOutcome(0.0, kind, reason)
        pending = rest[1:]
    out.samples = [r or SampleOutcome(0.0, "server", "not graded") for r in results]
    cap = limits.output_bytes
    out.stdout, out.stderr = out.stdout[-cap:], out.stderr[-cap:]
    out.seconds = time.monotonic() - start
    return out


_STATUS: dict[str, tuple[bool, str]] = {}
_STATUS_LOCK = threading.Lock()
_PROBE = "def grade(sample, item):\n    return 1.0\n"


def sandbox_status(refresh: bool = False) -> tuple[bool, str]:
    """(True, "") when python graders can run isolated here, else (False, why).
    Probed once per process by grading one sample in a real sandbox."""
    with _STATUS_LOCK:
        if refresh or "status" not in _STATUS:
            limits = SandboxLimits(wall_s=30.0, startup_s=30.0)
            try:
                res = run_python_batch(_PROBE, [({}, {})], limits).samples[0]
                ok = res.kind == "" and res.score == 1.0
                why = "" if ok else res.reason
            except Exception as e:  # noqa: BLE001 - any failure means unavailable
                ok, why = False, f"{type(e).__name__}: {e}"
            if not ok:
                logger.warning(f"python grader sandbox unavailable: {why}")
            _STATUS["status"] = (ok, why)
        return _STATUS["status"]
