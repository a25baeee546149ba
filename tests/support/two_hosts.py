"""Two "hosts" on one machine for the cluster tests (``scripts/two_hosts.sh``):
network namespaces joined by a veth pair, each with its own address, hostname,
``/tmp`` and ``/dev/shm``; the run root visible on host 1 only. A Ray head on
host 1 and a Ray worker node on host 2; the driver runs inside host 1.

Skips with the reason where namespaces cannot be made (not root, no ``ip`` or
``unshare``, a kernel that refuses them)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.paths import REPO

SCRIPT = REPO / "scripts" / "two_hosts.sh"
RAY = str(Path(sys.executable).parent / "ray")
GIB = 1024**3
RAY_PORT = 6379


def why_not() -> str | None:
    """Why two hosts cannot be made here, or None."""
    if sys.platform != "linux":
        return "network namespaces are Linux only"
    if os.geteuid() != 0:
        return "network and mount namespaces need root"
    for tool in ("ip", "unshare", "nsenter", "mount"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed"
    probe = subprocess.run(
        ["unshare", "--net", "--mount", "true"], capture_output=True, text=True
    )
    if probe.returncode != 0:
        return f"the kernel refuses new namespaces: {probe.stderr.strip()}"
    return None


@dataclass
class Host:
    name: str  # the hosts' pair
    index: int  # 1 or 2
    ip: str

    @property
    def netns(self) -> str:
        return f"{self.name}-h{self.index}"

    def argv(self, *cmd: str) -> list[str]:
        return ["bash", str(SCRIPT), "exec", self.name, str(self.index), *cmd]

    def run(self, *cmd: str, timeout: float = 300, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(
            self.argv(*cmd), capture_output=True, text=True, timeout=timeout, **kw
        )

    def popen(self, *cmd: str, **kw) -> subprocess.Popen:
        return subprocess.Popen(self.argv(*cmd), **kw)

    def cmdlines(self) -> list[str]:
        """Every process now inside this host's network namespace."""
        out = subprocess.run(
            ["ip", "netns", "pids", self.netns], capture_output=True, text=True
        ).stdout.split()
        lines = []
        for pid in out:
            try:
                raw = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            lines.append(raw.replace(b"\0", b" ").decode(errors="replace"))
        return lines


@dataclass
class TwoHosts:
    name: str
    root: Path  # the run root: on host 1 only
    h1: Host
    h2: Host
    ray: dict[int, list[str]] = field(default_factory=dict)
    resources: dict[int, dict[str, int]] = field(default_factory=dict)

    @property
    def ray_address(self) -> str:
        return f"{self.h1.ip}:{RAY_PORT}"

    def start_ray(self, head: dict[str, int], worker: dict[str, int]) -> None:
        """``ray start`` on each host with these logical resources ({cpus,
        memory_gib}); each node advertises its own address."""
        self.resources = {1: head, 2: worker}
        self.start_node(self.h1)
        self.start_node(self.h2)

    def start_node(self, host: Host) -> None:
        """Host 1's head, or a node joining it (again, after a loss), with the
        resources ``start_ray`` gave it."""
        res = self.resources[host.index]
        if host.index == 1:
            role = ["--head", f"--port={RAY_PORT}", "--include-dashboard=false"]
        else:
            role = [f"--address={self.ray_address}"]
        out = host.run(
            "env",
            "RAY_memory_monitor_refresh_ms=0",
            RAY,
            "start",
            *role,
            f"--node-ip-address={host.ip}",
            f"--num-cpus={res['cpus']}",
            f"--memory={res['memory_gib'] * GIB}",
            "--num-gpus=0",
            "--disable-usage-stats",
            "--object-store-memory=300000000",
        )
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
        deadline = time.monotonic() + 60
        status = None
        while time.monotonic() < deadline:
            status = self.h1.run(RAY, "status", f"--address={self.ray_address}")
            if status.stdout.count("node_") >= host.index:
                return
            time.sleep(1)
        seen = status.stdout if status else ""
        raise TimeoutError(f"host {host.index}'s Ray node did not join: {seen}")

    def lose(self, host: Host) -> None:
        """The host dies: every process in its namespace is killed at once
        (its Ray node, workers and servers). Not ``ray stop``, which kills
        every Ray process on the machine, both hosts' and the tests'."""
        pids = subprocess.run(
            ["ip", "netns", "pids", host.netns], capture_output=True, text=True
        ).stdout.split()
        if pids:
            subprocess.run(["kill", "-9", *pids], capture_output=True)


@contextlib.contextmanager
def two_hosts_up() -> Iterator[TwoHosts]:
    """Two hosts for the length of the block (``pytest.skip`` where none can be
    made), torn down after it."""
    reason = why_not()
    if reason is not None:
        pytest.skip(f"two hosts: {reason}")
    name = f"mt{uuid.uuid4().hex[:6]}"
    # Not under /tmp: each host has its own.
    root = Path("/var/tmp") / f"marlaas-{name}"
    root.mkdir(parents=True)
    subnet = f"10.213.{int(name[2:4], 16) % 200 + 20}"
    up = subprocess.run(
        ["bash", str(SCRIPT), "up", name, str(root), subnet],
        capture_output=True,
        text=True,
    )
    if up.returncode != 0:
        subprocess.run(["bash", str(SCRIPT), "down", name], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)
        pytest.skip(f"two hosts: {up.stderr.strip()}")
    hosts = TwoHosts(
        name, root, Host(name, 1, f"{subnet}.1"), Host(name, 2, f"{subnet}.2")
    )
    try:
        yield hosts
    finally:
        subprocess.run(
            ["bash", str(SCRIPT), "down", name], capture_output=True, timeout=120
        )
        shutil.rmtree(root, ignore_errors=True)
