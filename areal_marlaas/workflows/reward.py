"""A tenant's reward function, isolated from the trainer and from other tenants.

AReaL's ``AsyncRewardWrapper`` runs rewards in one process pool shared by every
workflow, and on a timeout it returns 0 while the stuck call keeps its worker
busy: one tenant's hanging reward would slowly take the pool from everyone, and
be scored as a wrong answer. Here each task gets its own small pool; a call past
the task's timeout has its pool's processes killed and raises, as does a reward
that raises or returns a non-number. The episode then fails, and a batch with no
good episode fails the task's rollout, which the scheduler retries or fails.

The pools' workers come from one fork server per process, which imports the
built-in rewards (torch among them: seconds). Starting a worker blocks until the
fork server is up, so calls hand work to a pool from a thread, never from the
event loop every episode of every task shares, and ``warm`` starts the fork
server in the background before the first reward needs it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import math
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from functools import partial

from areal.utils import logging

from areal_marlaas.rollout.reaper import set_pdeathsig

logger = logging.getLogger("MARLaaSReward")


class RewardError(RuntimeError):
    """A reward call raised, returned a non-number, or its worker died."""


class RewardTimeoutError(RewardError):
    """A reward call ran past the task's reward_timeout_s."""


def _die_with(trainer: int) -> None:
    """A worker's initializer: it dies with the fork server (PDEATHSIG), and
    with the trainer. The fork server would end when the trainer does, but
    every child it forks holds the write end of the pipe it watches for that,
    so a worker left waiting kept it alive: a SIGKILLed trainer's reward
    workers and fork server ran on. A thread watches the trainer instead."""
    set_pdeathsig(signal.SIGKILL)

    def watch() -> None:
        while True:
            try:
                os.kill(trainer, 0)
            except ProcessLookupError:
                os._exit(0)
            except PermissionError:  # a pid taken by another user's process
                os._exit(0)
            time.sleep(1.0)

    threading.Thread(target=watch, name="marlaas-reward-watch", daemon=True).start()


def _new_pool(workers: int) -> ProcessPoolExecutor:
    # Not forked from the trainer: a fork pins the trainer's pages as of that
    # moment (copy-on-write), and three reward workers of a 5 GB trainer ran a
    # 24 GiB machine out of memory in the paper mix.
    ctx = multiprocessing.get_context("forkserver")
    # The built-in rewards are imported once, in the fork server.
    ctx.set_forkserver_preload(["areal_marlaas.tasks"])
    return ProcessPoolExecutor(
        max_workers=workers,
        mp_context=ctx,
        initializer=_die_with,
        initargs=(os.getpid(),),
    )


class IsolatedReward:
    _pools: dict[str, ProcessPoolExecutor] = {}
    _lock = threading.Lock()
    _warming: threading.Thread | None = None

    def __init__(self, task: str, fn: Callable, timeout_s: float, workers: int = 2):
        self.task = task
        self.fn = fn
        self.timeout_s = timeout_s
        self.workers = workers

    def _pool(self) -> ProcessPoolExecutor:
        with self._lock:
            pool = self._pools.get(self.task)
            if pool is None:
                pool = _new_pool(self.workers)
                self._pools[self.task] = pool
            return pool

    @classmethod
    def warm(cls) -> threading.Thread:
        """Start this process's fork server in the background (once), so that
        the first reward does not wait for its imports. The server imports
        after ``ensure_running`` returns; one worker's round trip waits them out."""

        def start() -> None:
            with _new_pool(1) as pool:
                pool.submit(os.getpid).result()

        with cls._lock:
            if cls._warming is None:
                cls._warming = threading.Thread(
                    target=start, name="marlaas-reward-forkserver", daemon=True
                )
                cls._warming.start()
            return cls._warming

    @classmethod
    def _discard(cls, task: str, pool: ProcessPoolExecutor) -> None:
        """Kill ``pool``'s workers (a hung call never returns on its own)."""
        with cls._lock:
            if cls._pools.get(task) is pool:
                del cls._pools[task]
        for proc in list((getattr(pool, "_processes", None) or {}).values()):
            proc.kill()
        pool.shutdown(wait=False, cancel_futures=True)

    @classmethod
    def shutdown_all(cls) -> None:
        with cls._lock:
            pools = list(cls._pools.items())
        for task, pool in pools:
            cls._discard(task, pool)

    async def __call__(self, *args, **kwargs) -> float:
        # The fork server's imports (torch among them) are not the reward's
        # time: on a loaded 2-core machine they alone ran past a 30 s timeout.
        await asyncio.to_thread(self.warm().join)
        pool = self._pool()
        call = partial(self.fn, *args, **kwargs)
        try:
            # submit() may start a worker, which waits for the fork server: off
            # the loop. The timeout counts from the hand-over.
            future = await asyncio.to_thread(pool.submit, call)
            value = await asyncio.wait_for(
                asyncio.wrap_future(future), timeout=self.timeout_s
            )
        except TimeoutError:
            self._discard(self.task, pool)
            raise RewardTimeoutError(
                f"task {self.task!r}: reward_fn did not return within "
                f"{self.timeout_s:g}s (reward_timeout_s); its worker was killed"
            ) from None
        except BrokenProcessPool as e:
            self._discard(self.task, pool)
            raise RewardError(f"task {self.task!r}: reward worker died ({e})") from e
        except Exception as e:
            raise RewardError(
                f"task {self.task!r}: reward_fn raised {type(e).__name__}: {e}"
            ) from e
        try:
            reward = float(value)
        except (TypeError, ValueError):
            raise RewardError(
                f"task {self.task!r}: reward_fn returned {value!r}, not a number"
            ) from None
        if not math.isfinite(reward):
            raise RewardError(f"task {self.task!r}: reward_fn returned {reward}")
        reason = getattr(value, "reason", "")
        if reason:  # a grader's Score: keep why it scored what it did
            record_reward_reason(reason)
        record_reward_grades(getattr(value, "grades", None) or [])
        return reward


@contextlib.contextmanager
def _collecting(var: contextvars.ContextVar[list | None]) -> Iterator[list]:
    """A list that ``var`` names while the block runs (this asyncio task's)."""
    out: list = []
    token = var.set(out)
    try:
        yield out
    finally:
        var.reset(token)


# Why samples of the episode running in this asyncio task scored as they did (a
# grader's errors), for the job's events; see ``collect_reward_reasons``.
_REASONS: contextvars.ContextVar[list | None] = contextvars.ContextVar(
    "marlaas_reward_reasons", default=None
)
# Each grader's verdict on those samples (a grader's Score carries them), for
# per-grader step metrics.
_GRADES: contextvars.ContextVar[list | None] = contextvars.ContextVar(
    "marlaas_reward_grades", default=None
)


def collect_reward_reasons() -> contextlib.AbstractContextManager[list[str]]:
    return _collecting(_REASONS)


def collect_reward_grades() -> contextlib.AbstractContextManager[list[dict]]:
    return _collecting(_GRADES)


def record_reward_reason(reason: str) -> None:
    reasons = _REASONS.get()
    if reasons is not None:
        reasons.append(reason)


def record_reward_grades(grades: list) -> None:
    out = _GRADES.get()
    if out is not None:
        out.extend(dict(g) for g in grades)
