"""``marlaas train``: many tenant tasks, one base model, one server, one trainer.

The training stack (``train/stack.py``: the shared vLLM server, the trainer
pool, the run directory) with the config's tasks, and the scheduler runtime that
loops every task through rollout -> queue -> train -> commit -> publish.
"""

from __future__ import annotations

import time
from typing import Any

from areal.utils import logging
from areal.utils.hf_utils import load_hf_tokenizer

from areal_marlaas.config import MARLaaSConfig
from areal_marlaas.rollout.session import RolloutSession
from areal_marlaas.scheduler.runtime import Runtime, TaskRun
from areal_marlaas.train import screen
from areal_marlaas.train.stack import TrainingStack, add_tenant

logger = logging.getLogger("MARLaaSTrainer")


class MultiTaskTrainer:
    """``marlaas train``: the config's tasks on a training stack, to the end."""

    def __init__(self, cfg: MARLaaSConfig, task_errors: dict[str, str] | None = None):
        """``task_errors``: tasks that already failed their checks (they are
        reported failed; the others run)."""
        self.cfg = cfg
        self.stack = TrainingStack(cfg, title="marlaas train")
        self.store = self.stack.store
        self.failed_at_start: dict[str, str] = dict(task_errors or {})

    @property
    def session(self) -> RolloutSession | None:
        return self.stack.session

    def _prepare_tasks(self, engine) -> list[TaskRun]:
        tokenizer = load_hf_tokenizer(self.cfg.tokenizer_path)
        tasks = []
        for spec in self.cfg.tasks:
            if spec.name in self.failed_at_start:
                self._fail_at_start(spec.name, self.failed_at_start[spec.name])
                continue
            try:
                tasks.append(
                    add_tenant(
                        engine,
                        spec,
                        self.store,
                        tokenizer,
                        self.cfg,
                        self.stack.kv,
                        resume=self.cfg.resume,
                    )
                )
            except Exception as e:  # one tenant's broken data never stops the run
                self._fail_at_start(spec.name, f"{type(e).__name__}: {e}")
        return tasks

    def _fail_at_start(self, task: str, reason: str) -> None:
        logger.error(f"task {task} failed at start: {reason}")
        self.failed_at_start[task] = reason
        self.store.record(
            {"task": task, "status": "failed", "reason": reason, "t": time.time()}
        )

    def run(self) -> dict[str, Any]:
        stack, t0 = self.stack, time.monotonic()
        try:
            engine = stack.start_trainer()
            tasks = self._prepare_tasks(engine)
            rollout = stack.start_rollout()
            for t in tasks:
                rollout.register_task(
                    t.name,
                    t.start_version,
                    self.store.adapter_dir(t.name, t.start_version),
                )
            stack.timings["setup_s"] = time.monotonic() - t0
            stack.runtime = runtime = Runtime(
                tasks,
                rollout,
                stack.train_backend(),
                self.store,
                stack.runtime_options(on_step=stack.log_step),
            )
            stack.start_stats(sum(t.total_steps for t in tasks))
            stack.screen.start(
                {t.name: (t.start_version, t.total_steps) for t in tasks},
                stack.timings["setup_s"],
            )
            summary = runtime.run()
        finally:
            stack.close()
        for name, reason in self.failed_at_start.items():
            summary["tasks"][name] = {
                "steps": 0,
                "final_version": None,
                "status": "failed",
                "error": reason,
            }
        summary["server_restarts"] = stack.restarts
        summary["resumed"] = self.cfg.resume
        summary["run_dir"] = str(self.store.root)
        summary["timings"] = stack.timings
        self.store.write_summary(summary)
        return summary


def main(argv: list[str] | None = None) -> int:
    import sys

    from areal_marlaas.check import check_config
    from areal_marlaas.config import load_config

    cfg, _ = load_config(list(sys.argv[1:] if argv is None else argv))
    screen.quiet_logs(cfg)
    task_errors: dict[str, str] = {}  # a task that fails its checks fails alone
    check_config(cfg, task_errors)
    summary = MultiTaskTrainer(cfg, task_errors).run()
    print(screen.format_summary(summary), flush=True)
    failed = [n for n, t in summary["tasks"].items() if t["status"] != "done"]
    return 1 if failed else 0
