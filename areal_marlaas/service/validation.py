"""Checks on a ``POST /fine_tuning/jobs`` body. Every refusal is a 400 that names
the offending parameter (``model``, ``method.reinforcement.hyperparameters.x``,
...), so a tenant can fix it without guessing; keys the service would silently
ignore are refused too."""

from __future__ import annotations

import hashlib
import json
import math
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from areal_marlaas.agents.egress import EgressError, EgressPolicy
from areal_marlaas.agents.protocol import ToolEndpoint, ToolSpecError, parse_job_tools
from areal_marlaas.config.service import ServiceConfig
from areal_marlaas.graders.endpoint import ENDPOINT, public_grader
from areal_marlaas.methods import Method
from areal_marlaas.service.errors import bad_request

CREATE_FIELDS = {
    "model",
    "training_file",
    "validation_file",
    "method",
    "metadata",
    "seed",
    "suffix",
    "hyperparameters",
    "integrations",
}
HYPERPARAMETERS = (
    "batch_size",
    "n_epochs",
    "compute_multiplier",
    "eval_interval",
    "eval_samples",
    "learning_rate_multiplier",
    "reasoning_effort",
)
HP = "method.reinforcement.hyperparameters"
RL = "method.reinforcement"
# A supervised job's hyperparameters (OpenAI's SupervisedHyperparameters); a
# DPO job's add beta (DpoHyperparameters).
SUPERVISED_HYPERPARAMETERS = ("batch_size", "learning_rate_multiplier", "n_epochs")
DPO_HYPERPARAMETERS = ("batch_size", "beta", "learning_rate_multiplier", "n_epochs")
DEFAULT_BETA = 0.1
MAX_BETA = 100.0
# The keys of method.reinforcement a supervised or DPO job must not carry.
RL_ONLY = ("grader", "tools", "max_episode_steps")


class JobType(StrEnum):
    """``method.type``: what a job's steps optimize (its ``Method``)."""

    REINFORCEMENT = "reinforcement"
    SUPERVISED = "supervised"
    DPO = "dpo"

    @property
    def train_method(self) -> Method:
        return {
            JobType.REINFORCEMENT: Method.GRPO,
            JobType.SUPERVISED: Method.SFT,
            JobType.DPO: Method.DPO,
        }[self]

    @property
    def hyperparameters(self) -> tuple[str, ...]:
        return {
            JobType.REINFORCEMENT: HYPERPARAMETERS,
            JobType.SUPERVISED: SUPERVISED_HYPERPARAMETERS,
            JobType.DPO: DPO_HYPERPARAMETERS,
        }[self]


JOB_TYPES = tuple(t.value for t in JobType)
MAX_BATCH_SIZE = 1024
MAX_EPOCHS = 100
MAX_EVAL_SAMPLES = 10000
MAX_LR_MULTIPLIER = 100.0
SUFFIX = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
METADATA_PAIRS, METADATA_KEY, METADATA_VALUE = 16, 64, 512
FT_PREFIX = "ft:"


@dataclass
class JobRequest:
    """A syntactically valid create body; hyperparameters may still be "auto"."""

    model: str
    training_file: str
    validation_file: str | None
    type: JobType
    grader: dict[str, Any] | None  # reinforcement jobs
    hyperparameters: dict[str, Any]
    metadata: dict[str, str] | None
    # Agent RFT: the tool endpoints (headers included: stored, never shown)
    # and the model turns per episode; empty / None for a single-turn job.
    tools: list[dict[str, Any]]
    max_episode_steps: int | None
    seed: int
    suffix: str | None
    request_sha256: str


def parse_json_object(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise bad_request(
            "We could not parse the JSON body of your request. (HINT: This likely "
            "means you aren't using your HTTP library correctly. The OpenAI API "
            "expects a JSON payload, but what was sent was not valid JSON.)"
        ) from e
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.")
    return body


def parse_job_request(
    body: dict[str, Any],
    cfg: ServiceConfig,
    grader_validator: Callable[[dict], None],
    egress: EgressPolicy | None = None,
) -> JobRequest:
    """``egress``: the tenant's; every tool and endpoint-grader URL must pass it
    (checked again at every connection)."""
    unknown = sorted(set(body) - CREATE_FIELDS)
    if unknown:
        raise bad_request(
            f"Unrecognized request argument(s) supplied: {', '.join(unknown)}.",
            param=unknown[0],
            code="unknown_parameter",
        )
    model = body.get("model")
    # A tenant's own fine-tuned model (or checkpoint) continues; the API looks
    # it up among the tenant's (another's is a 404).
    if model != cfg.base_model and not (
        isinstance(model, str) and model.startswith(FT_PREFIX)
    ):
        raise bad_request(
            f"Model {model!r} cannot be fine-tuned here; this service fine-tunes "
            f"'{cfg.base_model}' and the fine-tuned models made from it.",
            param="model",
            code="model_not_available",
        )
    training_file = body.get("training_file")
    if not isinstance(training_file, str) or not training_file:
        raise bad_request("training_file is required: a file id.", "training_file")
    validation_file = body.get("validation_file")
    if validation_file is not None and (
        not isinstance(validation_file, str) or not validation_file
    ):
        raise bad_request("validation_file must be a file id.", "validation_file")
    if body.get("hyperparameters") not in (None, {}):
        raise bad_request(
            "The top-level hyperparameters are for supervised jobs; give them in "
            f"{HP}.",
            param="hyperparameters",
        )
    if body.get("integrations") not in (None, []):
        raise bad_request("Integrations are not supported.", param="integrations")
    kind, grader, hyperparameters, tools, steps = _method(
        body.get("method"), grader_validator, cfg
    )
    if grader is not None:
        _check_egress(grader, tools, egress or EgressPolicy())
    assert isinstance(model, str)  # the base model or an ft: name
    return JobRequest(
        model=model,
        training_file=training_file,
        validation_file=validation_file,
        type=kind,
        grader=grader,
        hyperparameters=hyperparameters,
        metadata=_metadata(body.get("metadata")),
        tools=tools,
        max_episode_steps=steps,
        seed=_seed(body.get("seed")),
        suffix=_suffix(body.get("suffix")),
        request_sha256=hashlib.sha256(
            json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
        ).hexdigest(),
    )


def endpoint_urls(grader: dict[str, Any], param: str) -> list[tuple[Any, str]]:
    """(url, its parameter) of every endpoint grader in ``grader``."""
    if grader.get("type") == "multi" and isinstance(grader.get("graders"), dict):
        return [
            u
            for k, sub in grader["graders"].items()
            if isinstance(sub, dict)
            for u in endpoint_urls(sub, f"{param}.graders.{k}")
        ]
    if grader.get("type") == ENDPOINT:
        return [(grader.get("url"), f"{param}.url")]
    return []


def _check_egress(grader: dict, tools: list[dict], policy: EgressPolicy) -> None:
    urls = endpoint_urls(grader, f"{RL}.grader") + [
        (t["server_url"], f"{RL}.tools.{i}.server_url") for i, t in enumerate(tools)
    ]
    for url, param in urls:
        try:
            policy.check(url, param)
        except EgressError as e:
            raise bad_request(str(e), param=e.param) from None


def _tools(rl: dict, cfg: ServiceConfig) -> tuple[list[dict], int | None]:
    tools, steps = rl.get("tools"), rl.get("max_episode_steps")
    if tools is None:
        if steps is not None:
            raise bad_request(
                f"{RL}.max_episode_steps needs {RL}.tools (an agent job).",
                param=f"{RL}.max_episode_steps",
            )
        return [], None
    try:
        parsed = parse_job_tools(tools, f"{RL}.tools")
    except ToolSpecError as e:
        raise bad_request(str(e), param=e.param) from None
    if steps is None:
        steps = cfg.max_episode_steps
    if not _is_int(steps) or not 1 <= steps <= cfg.max_episode_steps:
        raise bad_request(
            f"{RL}.max_episode_steps must be an integer from 1 to "
            f"{cfg.max_episode_steps}, got {steps!r}.",
            param=f"{RL}.max_episode_steps",
        )
    return [t.to_dict() for t in parsed], steps


def public_method(method: dict[str, Any]) -> dict[str, Any]:
    """A job's ``method`` as the API shows it: tool and endpoint-grader header
    values redacted (the tenant's secrets are stored, never returned)."""
    if method.get("type") != JobType.REINFORCEMENT:
        return dict(method)
    rl = dict(method.get("reinforcement") or {})
    if "grader" in rl:
        rl["grader"] = public_grader(rl["grader"])
    if "tools" in rl:
        rl["tools"] = [ToolEndpoint(**t).public() for t in rl["tools"]]
    return {**method, "reinforcement": rl}


def job_type(method: dict[str, Any]) -> JobType:
    """A stored job's type (its ``method`` passed validation)."""
    return JobType(method["type"])


def _method(method: Any, grader_validator: Callable[[dict], None], cfg: ServiceConfig):
    if method is None:
        raise bad_request(
            "method is required: {type: 'reinforcement', reinforcement: {grader, "
            "hyperparameters}}, {type: 'supervised', supervised: "
            "{hyperparameters}} or {type: 'dpo', dpo: {hyperparameters}}.",
            param="method",
        )
    if not isinstance(method, dict):
        raise bad_request("method must be an object.", param="method")
    kind = method.get("type")
    if kind not in JOB_TYPES:
        raise bad_request(
            f"method.type {kind!r} is not supported; this service runs "
            f"{' and '.join(repr(t) for t in JOB_TYPES)} fine-tuning.",
            param="method.type",
        )
    kind = JobType(kind)
    extra = sorted(set(method) - {"type", kind.value})
    if extra:
        why = (
            f"it is for {extra[0]} jobs and this is a {kind.value} job"
            if extra[0] in JOB_TYPES
            else "unrecognized"
        )
        raise bad_request(
            f"method.{extra[0]}: {why}.",
            param=f"method.{extra[0]}",
        )
    if kind is not JobType.REINFORCEMENT:
        return kind, None, _examples_method(kind, method.get(kind.value)), [], None
    return kind, *_reinforcement(method, grader_validator, cfg)


def _examples_method(kind: JobType, body: Any) -> dict[str, Any]:
    """A supervised or DPO job's hyperparameters (unresolved); a key of another
    method names itself."""
    where = f"method.{kind.value}"
    if body is None:
        return {}
    if not isinstance(body, dict):
        raise bad_request(f"{where} must be an object.", param=where)
    for key in sorted(body):
        if key == "hyperparameters":
            continue
        why = (
            "is for reinforcement jobs (method.reinforcement.*)"
            if key in RL_ONLY
            else f"is not a {kind.value} job's argument"
        )
        raise bad_request(f"{where}.{key} {why}.", param=f"{where}.{key}")
    hp = body.get("hyperparameters") or {}
    if not isinstance(hp, dict):
        raise bad_request(f"{where}.hyperparameters must be an object.", param=where)
    for key in sorted(hp):
        if key in kind.hyperparameters:
            continue
        owners = [
            t.value for t in JobType if t is not kind and key in t.hyperparameters
        ]
        why = (
            f"is for {' and '.join(owners)} jobs"
            if owners
            else f"is not a {kind.value} hyperparameter"
        )
        raise bad_request(
            f"{where}.hyperparameters.{key} {why} ({kind.value} ones: "
            f"{', '.join(kind.hyperparameters)}).",
            param=f"{where}.hyperparameters.{key}",
        )
    return dict(hp)


def _reinforcement(
    method: dict, grader_validator: Callable[[dict], None], cfg: ServiceConfig
):
    rl = method.get("reinforcement")
    if not isinstance(rl, dict):
        raise bad_request(
            "method.reinforcement is required: {grader, hyperparameters}.",
            param="method.reinforcement",
        )
    extra = sorted(
        set(rl) - {"grader", "hyperparameters", "tools", "max_episode_steps"}
    )
    if extra:
        raise bad_request(
            f"Unrecognized argument(s) in method.reinforcement: {', '.join(extra)}.",
            param=f"method.reinforcement.{extra[0]}",
        )
    grader = rl.get("grader")
    where = "method.reinforcement.grader"
    if not isinstance(grader, dict):
        raise bad_request(f"{where} is required: an object with a type.", where)
    try:
        grader_validator(grader)
    except ValueError as e:
        param = getattr(e, "param", None)
        if param and not param.startswith("method."):
            param = f"{where}.{param}"
        raise bad_request(f"Invalid grader: {e}", param=param or where) from e
    hp = rl.get("hyperparameters") or {}
    if not isinstance(hp, dict):
        raise bad_request(f"{HP} must be an object.", param=HP)
    extra = sorted(set(hp) - set(HYPERPARAMETERS))
    if extra:
        raise bad_request(
            f"Unrecognized hyperparameter(s): {', '.join(extra)}.",
            param=f"{HP}.{extra[0]}",
        )
    effort = hp.get("reasoning_effort")
    if effort not in (None, "default"):
        raise bad_request(
            f"reasoning_effort {effort!r} is not supported by this service's models; "
            "leave it out or use 'default'.",
            param=f"{HP}.reasoning_effort",
        )
    tools, steps = _tools(rl, cfg)
    hp = {k: v for k, v in hp.items() if k != "reasoning_effort"}
    return grader, hp, tools, steps


def _metadata(md: Any) -> dict[str, str] | None:
    if md is None:
        return None
    if not isinstance(md, dict):
        raise bad_request("metadata must be an object of strings.", "metadata")
    if len(md) > METADATA_PAIRS:
        raise bad_request(
            f"metadata has {len(md)} pairs; at most {METADATA_PAIRS} are allowed.",
            "metadata",
        )
    for k, v in md.items():
        if not 0 < len(k) <= METADATA_KEY:
            raise bad_request(
                f"metadata keys must be 1 to {METADATA_KEY} characters.", "metadata"
            )
        if not isinstance(v, str) or len(v) > METADATA_VALUE:
            raise bad_request(
                f"metadata[{k!r}] must be a string of at most {METADATA_VALUE} "
                "characters.",
                f"metadata.{k}",
            )
    return dict(md)


def _seed(seed: Any) -> int:
    if seed is None:
        return secrets.randbelow(2**31)
    if not _is_int(seed) or not 0 <= seed < 2**31:
        raise bad_request("seed must be an integer in [0, 2147483647].", "seed")
    return seed


def _suffix(suffix: Any) -> str | None:
    if suffix is None:
        return None
    if not isinstance(suffix, str) or not SUFFIX.match(suffix):
        raise bad_request(
            "suffix must be 1 to 64 characters: letters, digits, '.', '_' or '-'.",
            "suffix",
        )
    return suffix


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return (_is_int(v) or isinstance(v, float)) and math.isfinite(v)


def _int_hp(
    hp: dict, key: str, default: int, hi: int, why: str = "", where: str = HP
) -> int:
    v = hp.get(key, "auto")
    if v == "auto" or v is None:
        return default
    if not _is_int(v) or not 1 <= v <= hi:
        raise bad_request(
            f"{key} must be 'auto' or an integer from 1 to {hi}{why}, got {v!r}.",
            param=f"{where}.{key}",
        )
    return v


def _float_hp(hp: dict, key: str, default: float, hi: float, where: str = HP) -> float:
    v = hp.get(key, "auto")
    if v == "auto" or v is None:
        return default
    if not _is_number(v) or not 0 < v <= hi:
        raise bad_request(
            f"{key} must be 'auto' or a number in (0, {hi:g}], got {v!r}.",
            param=f"{where}.{key}",
        )
    return float(v)


def resolve_hyperparameters(
    hp: dict[str, Any],
    cfg: ServiceConfig,
    train_rows: int,
    kind: JobType = JobType.REINFORCEMENT,
) -> tuple[dict[str, Any], int]:
    """Replace "auto" with the service's defaults, range-check the rest, and plan
    the job: ``(resolved, steps_total)``."""
    if kind is not JobType.REINFORCEMENT:
        return _resolve_examples(kind, hp, cfg, train_rows)
    batch_size, n_epochs, lr_mult, steps = _plan(hp, cfg, train_rows, HP)
    cap = cfg.max_group_size / cfg.group_size_per_multiplier
    multiplier = _float_hp(
        hp, "compute_multiplier", cfg.default_compute_multiplier, cap
    )
    eval_interval = _int_hp(
        hp, "eval_interval", cfg.default_eval_interval, cfg.max_steps_per_job
    )
    eval_samples = _int_hp(
        hp, "eval_samples", cfg.default_eval_samples, MAX_EVAL_SAMPLES
    )
    group = max(2, round(cfg.group_size_per_multiplier * multiplier))
    resolved = {
        "batch_size": batch_size,
        "n_epochs": n_epochs,
        "compute_multiplier": multiplier,
        "eval_interval": eval_interval,
        "eval_samples": eval_samples,
        "learning_rate_multiplier": lr_mult,
        # What the trainer runs with.
        "group_size": group,
        "learning_rate": cfg.base_learning_rate * lr_mult,
    }
    return resolved, steps


def _plan(
    hp: dict[str, Any], cfg: ServiceConfig, train_rows: int, where: str
) -> tuple[int, int, float, int]:
    """What every method resolves alike: batch_size, n_epochs and
    learning_rate_multiplier, and the steps they make."""
    batch_size = _int_hp(
        hp,
        "batch_size",
        min(cfg.default_batch_size, train_rows),
        min(MAX_BATCH_SIZE, train_rows),
        f" (the training file has {train_rows} examples)",
        where,
    )
    n_epochs = _int_hp(hp, "n_epochs", cfg.default_n_epochs, MAX_EPOCHS, "", where)
    lr_mult = _float_hp(
        hp,
        "learning_rate_multiplier",
        cfg.default_learning_rate_multiplier,
        MAX_LR_MULTIPLIER,
        where,
    )
    steps = min(cfg.max_steps_per_job, math.ceil(train_rows * n_epochs / batch_size))
    return batch_size, n_epochs, lr_mult, steps


def _resolve_examples(
    kind: JobType, hp: dict[str, Any], cfg: ServiceConfig, train_rows: int
) -> tuple[dict[str, Any], int]:
    where = f"method.{kind.value}.hyperparameters"
    batch_size, n_epochs, lr_mult, steps = _plan(hp, cfg, train_rows, where)
    resolved: dict[str, Any] = {
        "batch_size": batch_size,
        "n_epochs": n_epochs,
        "learning_rate_multiplier": lr_mult,
        "learning_rate": cfg.supervised_learning_rate * lr_mult,
    }
    if kind is JobType.DPO:
        resolved["beta"] = _float_hp(hp, "beta", DEFAULT_BETA, MAX_BETA, where)
    return resolved, steps


def method_object(
    grader: dict[str, Any] | None,
    resolved: dict[str, Any],
    tools: list[dict[str, Any]] | None = None,
    max_episode_steps: int | None = None,
    kind: JobType = JobType.REINFORCEMENT,
) -> dict[str, Any]:
    """The job's ``method`` as stored: the grader, hyperparameters resolved, an
    agent job's tools (with their headers: ``public_method`` hides them) and
    max_episode_steps; a supervised or DPO job's hyperparameters."""
    if kind is not JobType.REINFORCEMENT:
        hp = {k: resolved[k] for k in kind.hyperparameters}
        return {"type": kind.value, kind.value: {"hyperparameters": hp}}
    assert grader is not None  # a reinforcement job has one
    hp = {k: resolved[k] for k in HYPERPARAMETERS if k in resolved}
    rl: dict[str, Any] = {"grader": grader, "hyperparameters": hp}
    if tools:
        rl["tools"] = [dict(t) for t in tools]
        rl["max_episode_steps"] = max_episode_steps
    return {"type": "reinforcement", "reinforcement": rl}
