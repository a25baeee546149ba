"""Task kinds: how a task's rows are made and which reward scores them.

Every row carries ``messages`` (the chat prompt) and ``answer`` (the reference the
reward function receives as a keyword argument).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from areal_marlaas.errors import ConfigError
from areal_marlaas.tasks.arithmetic import make_arithmetic_rows
from areal_marlaas.tasks.competition_math import load_math_rows
from areal_marlaas.tasks.gsm8k import load_gsm8k_rows
from areal_marlaas.tasks.messages import load_messages_rows
from areal_marlaas.tasks.records import read_records
from areal_marlaas.tasks.search import SCORER_REWARD_FNS, load_hotpotqa_rows
from areal_marlaas.tasks.sorting import items_problem, make_sorting_rows

if TYPE_CHECKING:
    from areal_marlaas.config import TaskSpec
    from areal_marlaas.config.tasks import TaskDatasetConfig

NUMERIC_REWARD = "areal_marlaas.tasks.rewards.numeric_answer_reward_fn"
SORTED_REWARD = "areal_marlaas.tasks.sorting.sorted_list_reward_fn"
MATH_REWARD = "areal_marlaas.tasks.competition_math.math_verify_reward_fn"
SEARCH_WORKFLOW = "areal_marlaas.workflows.search_agent.SearchAgentWorkflow"
DEFAULT_SYNTHETIC_SIZE = 1024


@dataclass(frozen=True)
class TaskKind:
    name: str
    reward_fn: str
    needs_path: bool
    load: Callable[[TaskSpec], list[dict]]
    # Default workflow (import path; "" = the single-turn RLVR workflow); the
    # workflow class says which of the task's settings it takes.
    workflow: str = ""
    needs_search: bool = False
    # What is wrong with a dataset's settings for this kind ("" = nothing).
    check: Callable[[TaskDatasetConfig], str] = lambda ds: ""


def _arithmetic(op: str) -> Callable[[TaskSpec], list[dict]]:
    def load(spec: TaskSpec) -> list[dict]:
        ds = spec.dataset
        return make_arithmetic_rows(
            op,
            ds.size or DEFAULT_SYNTHETIC_SIZE,
            ds.digits,
            spec.seed,
            split=ds.split,
            holdout=ds.holdout,
            digits2=ds.digits2 or None,
        )

    return load


def _sorting(spec: TaskSpec) -> list[dict]:
    ds = spec.dataset
    return make_sorting_rows(
        ds.size or DEFAULT_SYNTHETIC_SIZE,
        ds.digits,
        ds.items,
        spec.seed,
        split=ds.split,
        holdout=ds.holdout,
    )


def _sorting_check(ds: TaskDatasetConfig) -> str:
    return items_problem(ds.digits, ds.items)


def _gsm8k(spec: TaskSpec) -> list[dict]:
    rows = load_gsm8k_rows(spec.dataset.path, spec.dataset.split)
    return rows[: spec.dataset.size] if spec.dataset.size else rows


def _math(prefix: str) -> Callable[[TaskSpec], list[dict]]:
    def load(spec: TaskSpec) -> list[dict]:
        rows = load_math_rows(spec.dataset.path, spec.dataset.split, prefix)
        return rows[: spec.dataset.size] if spec.dataset.size else rows

    return load


def _wiki_search(spec: TaskSpec) -> list[dict]:
    # A remote server holds its own corpus; in process and auto read this one.
    if (
        not spec.search.remote
        and not Path(spec.search.corpus_path).expanduser().is_file()
    ):
        raise ValueError(f"search.corpus_path {spec.search.corpus_path!r} not found")
    rows = load_hotpotqa_rows(
        spec.dataset.path, spec.dataset.split, spec.search.max_tool_calls
    )
    return rows[: spec.dataset.size] if spec.dataset.size else rows


KINDS: dict[str, TaskKind] = {
    "addition": TaskKind("addition", NUMERIC_REWARD, False, _arithmetic("addition")),
    "multiplication": TaskKind(
        "multiplication", NUMERIC_REWARD, False, _arithmetic("multiplication")
    ),
    "sorting": TaskKind(
        "sorting", SORTED_REWARD, False, _sorting, check=_sorting_check
    ),
    "gsm8k": TaskKind("gsm8k", NUMERIC_REWARD, True, _gsm8k),
    "amc": TaskKind("amc", MATH_REWARD, True, _math("amc")),
    "math": TaskKind("math", MATH_REWARD, True, _math("math")),
    "wiki_search": TaskKind(
        "wiki_search",
        SCORER_REWARD_FNS["em"],
        True,
        _wiki_search,
        workflow=SEARCH_WORKFLOW,
        needs_search=True,
    ),
}


def load_task_rows(spec: TaskSpec) -> list[dict]:
    """The rows of a task's dataset (raises ``ConfigError`` naming the task):
    chat-prompt lines as they are (``dataset.format=messages``), else the kind's
    loader, else the file's records for a custom workflow."""
    try:
        if spec.dataset.format == "messages":
            rows = load_messages_rows(spec.dataset.path, spec.dataset.split)
        elif spec.kind:
            rows = KINDS[spec.kind].load(spec)
        else:
            rows = read_records(spec.dataset.path, spec.dataset.split)
        if spec.dataset.size and (spec.dataset.format == "messages" or not spec.kind):
            rows = rows[: spec.dataset.size]
    except FileNotFoundError as e:
        raise ConfigError(
            f"task {spec.name!r}: dataset.path {spec.dataset.path!r} not found ({e})"
        ) from e
    except (OSError, ValueError) as e:
        raise ConfigError(f"task {spec.name!r}: cannot read its dataset: {e}") from e
    if not rows:
        raise ConfigError(f"task {spec.name!r}: dataset has no rows")
    return rows


def load_eval_rows(spec: TaskSpec, tokenizer=None) -> list[dict]:
    """The rows every eval of ``spec`` uses: ``eval_samples`` of its
    ``eval_dataset`` in one draw seeded by the task's seed (prompts over
    ``max_prompt_tokens`` skipped), the same draw on every call."""
    from areal_marlaas.tasks.prompt_order import TaskData

    assert spec.eval_dataset is not None  # the config requires it with evals
    rows = load_task_rows(dataclasses.replace(spec, dataset=spec.eval_dataset))
    data = TaskData(rows, spec.seed, tokenizer, spec.max_prompt_tokens)
    try:
        return data.next_batch(min(spec.eval_samples, len(rows)))
    except ValueError as e:
        raise ConfigError(f"task {spec.name!r}: eval_dataset: {e}") from e
