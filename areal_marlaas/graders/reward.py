"""A grader as an AReaL reward function, for training.

``GraderReward(spec, ctx_dict)`` has AReaL's reward signature ``fn(prompt,
completions, prompt_ids, completion_ids, **row)``: the completion becomes the
``sample``, the dataset row the ``item``. It pickles (spec and context are plain
dicts; the parsed grader is rebuilt lazily in each process), so it runs in the
reward process pool of ``workflows/reward.py``; a python grader then starts its
sandbox from that worker.
"""

from __future__ import annotations

from areal_marlaas.graders.context import GradingContext
from areal_marlaas.graders.result import GraderGrade
from areal_marlaas.graders.runner import build_sample, run_grader_sync
from areal_marlaas.graders.spec import Grader, parse_grader


class Score(float):
    """A reward with the reason it is what it is ("" when grading had no error)
    and each grader's verdict (a multi grader's sub-graders one by one)."""

    reason: str
    grades: list[GraderGrade]

    def __new__(
        cls, value: float, reason: str = "", grades: list[GraderGrade] | None = None
    ) -> Score:
        obj = super().__new__(cls, value)
        obj.reason = reason
        obj.grades = list(grades or [])
        return obj

    def __reduce__(self):
        return (Score, (float(self), self.reason, self.grades))

    def __repr__(self) -> str:
        return f"Score({float(self)!r}, reason={self.reason!r})"


class GraderReward:
    def __init__(self, spec: dict, ctx_dict: dict | None = None):
        self.spec = spec
        self.ctx_dict = ctx_dict or {}
        self._grader: Grader | None = None
        self._ctx: GradingContext | None = None
        # Fail at construction, in the service, rather than in every worker.
        self._load()

    def _load(self) -> tuple[Grader, GradingContext]:
        if self._grader is None or self._ctx is None:
            ctx = GradingContext.from_dict(self.ctx_dict)
            ctx.load_extensions()
            # Parse only: the service validated the grader against the server
            # (check_grader) when the job was created.
            self._grader, self._ctx = parse_grader(self.spec), ctx
        return self._grader, self._ctx

    def __getstate__(self) -> dict:
        return {"spec": self.spec, "ctx_dict": self.ctx_dict}

    def __setstate__(self, state: dict) -> None:
        self.spec, self.ctx_dict = state["spec"], state["ctx_dict"]
        self._grader = self._ctx = None

    def __call__(
        self,
        prompt: str,
        completions: str,
        prompt_ids: list[int] | None = None,
        completion_ids: list[int] | None = None,
        **row,
    ) -> Score:
        grader, ctx = self._load()
        result = run_grader_sync(grader, build_sample(completions), row, ctx)
        return Score(result.reward, result.reason, result.per_grader)
