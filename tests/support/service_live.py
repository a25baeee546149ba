"""The job service as an operator starts it (``marlaas service`` in its own
process: the real vLLM server, trainer and HTTP API) and what its tests submit
through the official ``openai`` SDK."""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import openai
import psutil

from areal_marlaas.admission import KVModel
from areal_marlaas.bench.service_load import ServiceProcess, arithmetic_lines
from areal_marlaas.config import load_config
from areal_marlaas.config.service import ServiceRunConfig
from areal_marlaas.rollout.server import free_port
from tests.support.paths import REPO

CONFIG = str(REPO / "configs" / "service.yaml")
BASE = "SmolLM2-135M-Instruct"
TERMINAL = ("succeeded", "failed", "cancelled")
STRING_CHECK = {
    "type": "string_check",
    "name": "has_answer",
    "input": "{{ sample.output_text }}",
    "reference": "{{ item.answer }}",
    "operation": "like",
}
MULTI = {
    "type": "multi",
    "name": "answer_and_form",
    "graders": {
        "exact": STRING_CHECK,
        "close": {
            "type": "text_similarity",
            "name": "close",
            "input": "{{ sample.output_text }}",
            "reference": "The answer is {{ item.answer }}.",
            "evaluation_metric": "fuzzy_match",
        },
    },
    "calculate_output": "0.7 * exact + 0.3 * close",
}


def lines(n: int, seed: int) -> bytes:
    return arithmetic_lines(n, seed)


def method(grader: dict, **hp) -> dict:
    hp = {"batch_size": 2, "n_epochs": 1, "compute_multiplier": 0.5, **hp}
    return {
        "type": "reinforcement",
        "reinforcement": {"grader": grader, "hyperparameters": hp},
    }


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class TenantClient(openai.OpenAI):
    """The official SDK client of one tenant, with only its key and base URL
    set; ``tenant`` is its name as the operator added it."""

    def __init__(self, tenant: str, base_url: str, api_key: str):
        super().__init__(base_url=base_url, api_key=api_key, max_retries=0)
        self.tenant = tenant


class LiveService(ServiceProcess):
    """``marlaas service`` in its own process session, like an operator runs it.
    ``vllm``: the address of a running server to attach to (empty: the service
    launches its own, and it ends with the service)."""

    def __init__(self, root: Path, overrides: list[str], vllm: str = ""):
        root = Path(root)
        # Its workers find each other under its own root, never another
        # service's of the same experiment and trial.
        own = [f"cluster.name_resolve.nfs_record_root={root / 'nr'}"]
        if vllm:
            own.append(f'server.addresses=["{vllm}"]')
        super().__init__(root, CONFIG, [*own, *overrides], free_port())

    @property
    def run_dir(self) -> Path:
        """The service's training run directory (steps.jsonl, events, logs)."""
        return self.root / "runs" / "marlaas-service" / "service"

    def marlaas(self, *args) -> str:
        out = subprocess.run(
            [sys.executable, "-m", "areal_marlaas.cli", *args],
            capture_output=True,
            text=True,
            check=True,
            timeout=300,
        )
        return out.stdout

    def add_tenant(self, name: str) -> TenantClient:
        """``marlaas service tenant add`` (``name`` made unique in this store, as
        every test brings tenants of its own): the tenant's SDK client."""
        name = f"{name}-{secrets.token_hex(3)}"
        key = self.marlaas(
            "service", "tenant", "add", name, "--config", CONFIG, *self.overrides
        ).strip()
        return TenantClient(name, f"http://127.0.0.1:{self.port}/v1", key)

    def admin_key(self) -> str:
        out = self.marlaas("service", "admin-key", "--config", CONFIG, *self.overrides)
        return out.strip()

    def start(self, timeout: float = 600.0) -> None:
        self.log_from = self.log.stat().st_size if self.log.exists() else 0
        super().start(timeout)

    def output(self) -> str:
        """What this start of the service printed (its log is appended to)."""
        with open(self.log, "rb") as f:
            f.seek(self.log_from)
            return f.read().decode(errors="replace")

    def signal_group(self, sig: int, timeout: float = 300) -> tuple[int, list[int]]:
        """``sig`` to the service's whole process group, as ``kill -- -PGID``,
        systemd or a terminal's Ctrl-C send it: the service's exit code, and
        which of its descendants (trainer and rollout workers, the vLLM
        server's processes) were still alive 60 s after it exited."""
        assert self.proc is not None
        family = psutil.Process(self.proc.pid).children(recursive=True)
        os.killpg(self.proc.pid, sig)
        code = self.proc.wait(timeout)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and any(map(_alive, family)):
            time.sleep(0.5)
        return code, [p.pid for p in family if _alive(p)]

    @contextlib.contextmanager
    def on_failure(self):
        """On a failure inside the block, print the service's state and log
        (pytest shows them with the failure)."""
        try:
            yield self
        except BaseException:
            print(f"service exit code: {self.proc.poll()}\n{self.tail(150)}")
            raise

    @contextlib.contextmanager
    def running(self):
        """Start; on the way out stop, and on a failure first print the
        service's state and log (pytest shows it with the failure)."""
        self.start()
        try:
            with self.on_failure():
                yield self
        finally:
            self.stop()


def kv_of_one_batch(overrides: list[str]) -> int:
    cfg, _ = load_config(["--config", CONFIG, *overrides], ServiceRunConfig)
    kv = KVModel.for_config(cfg)
    svc = cfg.service
    return kv.sequence_bytes(svc.max_prompt_tokens + svc.max_new_tokens) * 2 * 2


def wait_all(client: openai.OpenAI, ids: list[str], timeout: float, seen=None):
    """Poll until every job ended; ``seen`` collects each job's statuses in
    order."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        jobs = {i: client.fine_tuning.jobs.retrieve(i) for i in ids}
        if seen is not None:
            for i, j in jobs.items():
                if not seen.setdefault(i, []) or seen[i][-1] != j.status:
                    seen[i].append(j.status)
        if all(j.status in TERMINAL for j in jobs.values()):
            return jobs
        time.sleep(1)
    raise TimeoutError({i: j.status for i, j in jobs.items()})
