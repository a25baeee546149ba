"""The job service as an operator starts it (``marlaas service`` in its own
process: the real vLLM server, trainer and HTTP API) and what its tests submit
through the official ``openai`` SDK."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from pathlib import Path

import openai

from areal_marlaas.admission import KVModel
from areal_marlaas.bench.service_load import ServiceProcess, arithmetic_lines
from areal_marlaas.config import load_config
from areal_marlaas.config.service import ServiceRunConfig
from areal_marlaas.rollout.server import free_port
from tests.conftest import REPO

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


class LiveService(ServiceProcess):
    """``marlaas service`` in its own process session, like an operator runs it."""

    def __init__(self, root: Path, overrides: list[str]):
        super().__init__(root, CONFIG, overrides, free_port())

    def marlaas(self, *args) -> str:
        out = subprocess.run(
            [sys.executable, "-m", "areal_marlaas.cli", *args],
            capture_output=True,
            text=True,
            check=True,
            timeout=300,
        )
        return out.stdout

    def add_tenant(self, name: str) -> openai.OpenAI:
        key = self.marlaas(
            "service", "tenant", "add", name, "--config", CONFIG, *self.overrides
        ).strip()
        return openai.OpenAI(
            base_url=f"http://127.0.0.1:{self.port}/v1", api_key=key, max_retries=0
        )

    @contextlib.contextmanager
    def running(self):
        """Start; on the way out stop, and on a failure first print the
        service's state and log (pytest shows it with the failure)."""
        self.start()
        try:
            yield self
        except BaseException:
            print(f"service exit code: {self.proc.poll()}\n{self.tail(150)}")
            raise
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
