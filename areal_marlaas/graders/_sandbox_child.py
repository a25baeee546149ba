"""The python grader sandbox's child: ``python -I -S _sandbox_child.py``.

Stdlib only, started by sandbox.py with a minimal environment. It reads one JSON
job from stdin, then:

* P0 (this process, still privileged) unshares the mount, network, PID, IPC and
  UTS namespaces (as non-root: a user namespace too, mapping its own uid to 0)
  and forks;
* P1 (PID 1 of the new PID namespace) mounts a tmpfs root holding read-only bind
  mounts of /usr, the interpreter's prefix and a few /dev nodes, pivots into it
  and detaches the old root, then forks P2 and reports how P2 ended;
* P2 sets resource limits, drops to an unprivileged uid (as root) or drops its
  capabilities (in a user namespace), then runs the tenant's source and
  ``grade(sample, item)`` for each pair.

Results go to fd 3 as JSON lines: ``{"ready": ...}`` or ``{"load_error": ...}``,
then ``{"i": k, "score": x}`` / ``{"i": k, "error": tb}`` / ``{"i": k, "bad": r}``
per pair, then P1's ``{"exit": ...}`` about P2; ``{"setup_error": ...}`` if isolation
could not be set up (the parent then refuses to grade: fail closed).
"""

import ctypes
import json
import linecache
import math
import os
import platform
import resource
import signal
import sys
import time
import traceback

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_RELATIME = 1 << 21
MNT_DETACH = 2
PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203}
PROTO = 3  # replaced by the job's proto_fd
NEW_ROOT = "/tmp"
MAX_TRACEBACK = 4000

libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]


def check(ret, what):
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def send(obj):
    data = (json.dumps(obj) + "\n").encode()
    while data:
        data = data[os.write(PROTO, data) :]


def mount(src, dst, fstype, flags, opts=None):
    enc = [None if s is None else s.encode() for s in (src, dst, fstype, opts)]
    check(libc.mount(enc[0], enc[1], enc[2], flags, enc[3]), f"mount {src} {dst}")


def kept_flags(path):
    """Flags of ``path``'s mount that a read-only remount must keep (in a user
    namespace the kernel refuses to clear them)."""
    f = os.statvfs(path).f_flag
    out = 0
    for st, ms in (
        (os.ST_NODEV, MS_NODEV),
        (os.ST_NOEXEC, MS_NOEXEC),
        (os.ST_NOATIME, MS_NOATIME),
        (os.ST_NODIRATIME, MS_NODIRATIME),
        (os.ST_RELATIME, MS_RELATIME),
    ):
        if f & st:
            out |= ms
    return out


def bind_ro(src, extra=0):
    dst = NEW_ROOT + src
    if os.path.isdir(src):
        os.makedirs(dst, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        open(dst, "w").close()
    mount(src, dst, None, MS_BIND | MS_REC)
    flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | kept_flags(src) | extra
    mount(None, dst, None, flags)


def build_root(cfg):
    """A read-only tmpfs root with only what the interpreter needs."""
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    for src in cfg["bind_dirs"]:
        if src == NEW_ROOT or src.startswith(NEW_ROOT + "/"):
            raise OSError(f"cannot expose {src}: it lies under {NEW_ROOT}")
    mount("tmpfs", NEW_ROOT, "tmpfs", MS_NOSUID | MS_NODEV, "size=4m,mode=0755")
    for src in cfg["bind_dirs"]:
        bind_ro(src, MS_NODEV)
    for src in cfg["bind_files"]:
        if os.path.exists(src):
            bind_ro(src)
    for link in cfg["symlinks"]:
        os.symlink(os.readlink(link), NEW_ROOT + link)
    os.makedirs(NEW_ROOT + "/tmp", exist_ok=True)
    os.chdir(NEW_ROOT)
    os.mkdir(".oldroot")
    nr = SYS_PIVOT_ROOT.get(platform.machine())
    how = "pivot_root"
    if nr is not None and libc.syscall(nr, b".", b".oldroot") == 0:
        os.chdir("/")
        check(libc.umount2(b"/.oldroot", MNT_DETACH), "umount old root")
        os.rmdir("/.oldroot")
    else:
        # No pivot_root (e.g. an initramfs root): chroot; the old root stays
        # mounted but unreachable once the capability to chroot is dropped.
        how = "chroot"
        os.chroot(".")
        os.chdir("/")
    mount(None, "/", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    return how


def drop_capabilities():
    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [(n, ctypes.c_uint32) for n in ("eff", "perm", "inh")]

    header, data = Header(0x20080522, 0), (Data * 2)()
    check(libc.capset(ctypes.byref(header), data), "capset")


def set_limits(cfg, n_pairs):
    mem = cfg["memory_mb"] * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    nofile = cfg["open_files"]
    resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
    # The hard CPU limit covers the whole batch; arm_cpu re-arms the soft limit
    # (SIGXCPU) per pair. The parent's wall deadline per pair bounds both.
    total = int(cfg["cpu_s"] * (n_pairs + 1)) + 2
    resource.setrlimit(resource.RLIMIT_CPU, (min(int(cfg["cpu_s"]) + 1, total), total))


def arm_cpu(cpu_s):
    ru = resource.getrusage(resource.RUSAGE_SELF)
    used = ru.ru_utime + ru.ru_stime
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    resource.setrlimit(resource.RLIMIT_CPU, (min(math.ceil(used + cpu_s), hard), hard))


def tenant_traceback(exc):
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    # Our own frames say nothing to the tenant; keep theirs.
    lines = text.splitlines(True)
    keep = [ln for ln in lines if "_sandbox_child.py" not in ln]
    text = "".join(keep)
    return text[-MAX_TRACEBACK:]


def run_tenant(job):
    cfg = job["config"]
    source = job["source"]
    linecache.cache["<grader>"] = (len(source), None, source.splitlines(True), "x")
    namespace = {"__name__": "grader"}
    arm_cpu(cfg["cpu_s"])
    start = time.monotonic()
    try:
        exec(compile(source, "<grader>", "exec"), namespace)
        grade = namespace.get("grade")
        if not callable(grade):
            raise TypeError("the source defines no grade(sample, item) function")
    except BaseException as e:  # noqa: BLE001 - a tenant error of any kind
        send({"load_error": tenant_traceback(e)})
        return
    send({"ready": True, "t": time.monotonic() - start, "root": cfg.get("root")})
    for i, (sample, item) in enumerate(job["pairs"]):
        arm_cpu(cfg["cpu_s"])
        start = time.monotonic()
        try:
            value = grade(sample, item)
        except BaseException as e:  # noqa: BLE001
            send({"i": i, "error": tenant_traceback(e), "t": time.monotonic() - start})
            continue
        took = time.monotonic() - start
        if isinstance(value, int | float) and not isinstance(value, bool):
            send({"i": i, "score": float(value), "t": took})
        else:
            send({"i": i, "bad": repr(value)[:200], "t": took})


def exit_info(status, ru):
    return {
        "code": os.waitstatus_to_exitcode(status),
        "cpu_s": ru.ru_utime + ru.ru_stime,
        "maxrss_kb": ru.ru_maxrss,
    }


def p1(job, as_root):
    """PID 1 of the namespace: builds the root, then runs the tenant in a child
    (the kernel drops default-action signals such as SIGXCPU sent to a PID
    namespace's init, so the tenant must not be PID 1)."""
    check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl")
    cfg = job["config"]
    cfg["root"] = build_root(cfg)
    pid = os.fork()
    if pid == 0:
        try:
            p2(job, as_root)
        except BaseException as e:  # noqa: BLE001 - any setup failure fails closed
            try:
                send({"setup_error": f"sandbox setup failed: {e!r}"})
            finally:
                os._exit(4)
        os._exit(0)
    _, status, ru = os.wait4(pid, 0)
    send({"exit": exit_info(status, ru)})


def p2(job, as_root):
    cfg = job["config"]
    devnull = os.open("/dev/null", os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    set_limits(cfg, len(job["pairs"]))
    resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))  # no fork, no threads
    if as_root:
        uid = cfg["uid"]
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    else:
        drop_capabilities()
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl no_new_privs")
    # Changing credentials cleared the parent-death signal: set it again.
    check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl")
    os.chdir("/")
    run_tenant(job)


def write_id_maps(uid, gid):
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"0 {uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"0 {gid} 1")


def main():
    global PROTO
    job = json.loads(sys.stdin.buffer.read())
    cfg = job["config"]
    PROTO = cfg["proto_fd"]
    check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl")
    if os.getppid() != cfg["parent_pid"]:
        os._exit(1)  # the service died before we could ask to die with it
    as_root = os.geteuid() == 0
    flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
    try:
        if as_root:
            check(libc.unshare(flags), "unshare")
        else:
            uid, gid = os.geteuid(), os.getegid()
            check(libc.unshare(flags | CLONE_NEWUSER), "unshare (user namespace)")
            write_id_maps(uid, gid)
    except OSError as e:
        send({"setup_error": f"cannot create namespaces: {e}"})
        os._exit(3)
    pid = os.fork()
    if pid == 0:
        try:
            p1(job, as_root)
        except BaseException as e:  # noqa: BLE001 - any setup failure fails closed
            try:
                send({"setup_error": f"sandbox setup failed: {e!r}"})
            finally:
                os._exit(4)
        os._exit(0)
    _, status, ru = os.wait4(pid, 0)
    if status != 0:
        # P1 reports how the tenant process ended; this covers P1 itself dying.
        send({"exit": exit_info(status, ru)})
    os._exit(0)


if __name__ == "__main__":
    main()
