"""What a job becomes: a task spec (one LoRA adapter, trained with GRPO on its
grader, or with SFT or DPO on its examples), after its training file passed
validation against its grader (or as examples of its method).

A training line is ``{"messages": [... ending with a user turn], <fields>}``; the
fields are the grader's ``item`` (``{{ item.answer }}``) and the reward function's
keyword arguments. A ``{"type": "marlaas", "kind": K}`` grader picks a built-in
kind: its reward (and, for an agentic kind, its workflow) with the job's lines.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from areal.utils.hf_utils import apply_chat_template

from areal_marlaas.agents.egress import EgressPolicy
from areal_marlaas.agents.protocol import check_row_tools, prompt_messages
from areal_marlaas.config import TaskDatasetConfig, TaskSpec
from areal_marlaas.config.agent import AgentConfig
from areal_marlaas.config.service import ServiceConfig
from areal_marlaas.graders import parse_grader
from areal_marlaas.graders.templates import Ref, Template, TemplateError, resolve
from areal_marlaas.methods import Method
from areal_marlaas.methods.examples import check_row, example
from areal_marlaas.service.grading import marlaas_kind
from areal_marlaas.service.tables import Job
from areal_marlaas.service.validation import JobType, job_type
from areal_marlaas.tasks.messages import check_messages_row

# Fields a built-in kind's reward reads from each line.
KIND_FIELDS = {"wiki_search": ("answer", "question")}
DEFAULT_KIND_FIELDS = ("answer",)


class JobFileError(ValueError):
    """A training/validation file the job's grader cannot use; ``param`` names
    the file field, the message the line and the fix."""

    def __init__(self, message: str, param: str = "training_file"):
        super().__init__(message)
        self.param = param


def task_spec(
    job: Job,
    svc: ServiceConfig,
    train_path: Path,
    valid_path: Path | None = None,
    weight: float = 1.0,
    egress: EgressPolicy | None = None,
    init_adapter: Path | None = None,
) -> TaskSpec:
    """The job as a task: its adapter is named after the job's task name, its
    tenant (fair share) the job's with the tenant's ``weight``; with a
    validation file, it evaluates ``eval_samples`` of its rows every
    ``eval_interval`` steps and after the last. An agent job's tools reach what
    ``egress`` (its tenant's policy) allows. A job continuing a fine-tuned
    model starts from ``init_adapter`` (for DPO also its reference)."""
    hp = job.hyperparameters
    kind = job_type(job.method)
    start = str(init_adapter) if init_adapter is not None else ""
    if kind is not JobType.REINFORCEMENT:
        spec = _examples_spec(job, kind, svc, train_path, valid_path, weight)
        spec.init_adapter = start
        return spec
    evals: dict = {}
    if valid_path is not None:
        evals = {
            "eval_dataset": TaskDatasetConfig(path=str(valid_path), format="messages"),
            "eval_interval": int(hp["eval_interval"]),
            "eval_samples": int(hp["eval_samples"]),
        }
    rl = job.method["reinforcement"]
    grader = rl["grader"]
    kind = marlaas_kind(grader) or ""
    agent = AgentConfig(
        tools=[dict(t) for t in rl.get("tools") or []],
        max_episode_steps=int(rl.get("max_episode_steps") or svc.max_episode_steps),
        max_turn_tokens=svc.max_new_tokens,
        tool_timeout_s=svc.tool_timeout_s,
        egress_allow=list(egress.allow) if egress else [],
        egress_only_allowed=egress.only_allowed if egress else False,
    )
    return TaskSpec(
        name=job.task_name,
        kind=kind,
        dataset=TaskDatasetConfig(path=str(train_path), format="messages"),
        grader=None if kind else dict(grader),
        agent=agent,
        batch_size=int(hp["batch_size"]),
        n_samples=int(hp["group_size"]),
        max_new_tokens=svc.agent_episode_tokens
        if agent.enabled
        else svc.max_new_tokens,
        max_prompt_tokens=prompt_limit(svc, job),
        temperature=svc.temperature,
        total_steps=int(job.steps_total),
        lr=float(hp["learning_rate"]),
        seed=int(job.seed or 0),
        tenant=job.tenant_id,
        weight=weight,
        init_adapter=start,
        **evals,
    )


def _examples_spec(
    job: Job,
    kind: JobType,
    svc: ServiceConfig,
    train_path: Path,
    valid_path: Path | None,
    weight: float,
) -> TaskSpec:
    """A supervised or DPO job as a task: its examples, and its validation file
    scored after every step (a batch) and after the last (all of it)."""
    hp = job.hyperparameters
    valid = None
    if valid_path is not None:
        valid = TaskDatasetConfig(path=str(valid_path))
    return TaskSpec(
        name=job.task_name,
        method=kind.train_method,
        beta=float(hp.get("beta", 0.1)),
        dataset=TaskDatasetConfig(path=str(train_path)),
        batch_size=int(hp["batch_size"]),
        max_prompt_tokens=svc.max_prompt_tokens,
        max_new_tokens=svc.max_new_tokens,
        total_steps=int(job.steps_total),
        lr=float(hp["learning_rate"]),
        seed=int(job.seed or 0),
        tenant=job.tenant_id,
        weight=weight,
        eval_dataset=valid,
    )


def check_example_lines(
    method: Method, path: Path, tokenizer, max_tokens: int, param: str
) -> int:
    """Every line is an example of ``method`` (SFT: OpenAI's chat format ending
    with the assistant's turn; DPO: input, preferred_output and
    non_preferred_output) of at most ``max_tokens`` tokens a sequence (not
    counted without a ``tokenizer``); returns the number of lines. Raises
    ``JobFileError`` naming the first bad line."""
    n_rows = 0
    for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        where = f"{param} line {n}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise JobFileError(f"{where}: not valid JSON ({e.msg})", param) from e
        try:
            if tokenizer is not None:
                example(method, tokenizer, row, max_tokens, where)
            else:
                check_row(method, row, where)
        except ValueError as e:
            raise JobFileError(str(e), param) from e
        n_rows += 1
    if not n_rows:
        raise JobFileError(f"{param}: the file has no lines.", param)
    return n_rows


def prompt_limit(svc: ServiceConfig, job: Job) -> int:
    """The longest prompt the job trains on: an agent job's carries its tools."""
    if job.method["reinforcement"].get("tools"):
        return svc.agent_max_prompt_tokens
    return svc.max_prompt_tokens


def item_refs(obj: Any) -> list[tuple[Template, Ref]]:
    """Every ``{{ item.* }}`` reference in a parsed grader (sub-graders too)."""
    out: list[tuple[Template, Ref]] = []
    if isinstance(obj, Template):
        return [(obj, r) for r in obj.refs if r.namespace == "item"]
    if isinstance(obj, dict):
        for v in obj.values():
            out += item_refs(v)
    elif isinstance(obj, tuple | list):
        for v in obj:
            out += item_refs(v)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            out += item_refs(getattr(obj, f.name))
    return out


def check_lines(
    path: Path,
    grader: dict,
    tokenizer,
    max_prompt_tokens: int,
    param: str,
    tools: set[str] | None = None,
) -> tuple[int, int]:
    """Every line is a chat prompt whose fields the grader reads (and, for an
    agent job with endpoints ``tools``, whose tool schemas are valid and each
    have an endpoint); returns (lines, lines whose prompt is too long to train
    on). Raises ``JobFileError`` naming the first bad line."""
    rows = []
    for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append((n, json.loads(line)))
        except json.JSONDecodeError as e:
            # The line number, never the server's path of the file.
            raise JobFileError(
                f"{param} line {n}: not valid JSON ({e.msg})", param
            ) from e
    kind = marlaas_kind(grader)
    refs = [] if kind else item_refs(parse_grader(grader))
    needed = KIND_FIELDS.get(kind, DEFAULT_KIND_FIELDS) if kind else ()
    too_long = 0
    for n, row in rows:
        where = f"{param} line {n}"
        try:
            check_messages_row(row, where)
            if tools is not None:
                check_row_tools(row, where, tools)
            elif "tools" in row:
                raise ValueError(
                    f"{where}: has 'tools' but the job lists none; give the job "
                    "method.reinforcement.tools (their endpoints)."
                )
        except ValueError as e:
            raise JobFileError(str(e), param) from e
        for key in needed:
            if key not in row:
                raise JobFileError(
                    f"{where}: the {kind!r} grader reads the field {key!r}, which "
                    "this line lacks; add it next to messages.",
                    param,
                )
        for template, ref in refs:
            try:
                resolve(ref, {}, row, template.source)
            except TemplateError:
                raise JobFileError(
                    f"{where}: the grader reads {ref.text}, which this line lacks "
                    f"(template {template.source!r}); add the field next to "
                    "messages or change the grader.",
                    param,
                ) from None
        ids = apply_chat_template(
            tokenizer, prompt_messages(row), tokenize=True, add_generation_prompt=True
        )
        too_long += len(ids) > max_prompt_tokens
    if not rows:
        raise JobFileError(f"{param}: the file has no lines.", param)
    if too_long == len(rows):
        raise JobFileError(
            f"{param}: every prompt is longer than the service's "
            f"{max_prompt_tokens} tokens (service.max_prompt_tokens).",
            param,
        )
    return len(rows), too_long


def to_admit(
    candidates: list[Job], held: dict[str, str], max_running: int, max_tasks: int
) -> list[Job]:
    """Which of ``candidates`` (oldest first: jobs the store lists ``running``,
    then ``queued``) the scheduler takes now. ``held``: task name -> tenant of the
    jobs it holds. A job that was running before a restart is always taken back;
    a queued one only while its tenant holds fewer than ``max_running`` jobs and
    the scheduler fewer than ``max_tasks``. The others stay queued, never fail."""
    held = dict(held)
    out = []
    for job in candidates:
        if job.task_name in held:
            continue
        if len(held) >= max_tasks:
            break
        mine = sum(t == job.tenant_id for t in held.values())
        if job.status == "queued" and mine >= max_running:
            continue
        held[job.task_name] = job.tenant_id
        out.append(job)
    return out
