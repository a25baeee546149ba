"""A real vLLM server dies with the process that launched it, even on SIGKILL."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

from areal_marlaas.rollout.reaper import group_members
from tests.helpers import alive, wait_for

# ~90 s on 2 CPU cores (a server of its own); tests/unit/test_fault.py has the same
# check with a stand-in server in the default suite.
pytestmark = [pytest.mark.vllm, pytest.mark.slow]

LAUNCH = textwrap.dedent(
    """
    import os, sys, time
    from areal_marlaas.rollout.server import (
        MultiLoRAvLLMConfig, RolloutServerConfig, VLLMServer,
    )
    cfg = MultiLoRAvLLMConfig(max_loras=1, max_lora_rank=8, max_model_len=256)
    srv = VLLMServer(sys.argv[1], cfg, RolloutServerConfig(cpu_kvcache_space_gib=1),
                     sys.argv[2])
    srv.start()
    print("PGID", srv.process.pid, flush=True)
    time.sleep(600)
    """
)


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_sigkilled_trainer_leaves_no_vllm_process(model_path, tmp_path):
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCH, str(model_path), str(tmp_path / "vllm.log")],
        stdout=subprocess.PIPE,
        text=True,
    )
    lines = []
    for line in launcher.stdout:  # AReaL's logger writes here too
        lines.append(line)
        if line.startswith("PGID "):
            break
    else:
        pytest.fail("launcher exited:\n" + "".join(lines)[-3000:])
    pgid = int(lines[-1].split()[1])
    group = group_members(pgid) + [pgid]
    # The reaper, vLLM's API server and its EngineCore worker.
    assert len(group) >= 3, [cmdline(p) for p in group]
    assert any("vllm" in cmdline(p) for p in group)

    launcher.send_signal(signal.SIGKILL)
    launcher.wait()

    gone_s = wait_for(lambda: not any(alive(p) for p in group), 60)
    assert not group_members(pgid)
    print(f"{len(group)} server processes gone {gone_s:.1f}s after SIGKILL")
