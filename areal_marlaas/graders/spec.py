"""Grader specs: the OpenAI grader JSON, parsed into typed objects and back.

``parse_grader`` checks everything that can be checked without a server: field
names and types, ``type``, operations and metrics, template references, the
python source size, ``range``, the multi grader's formula, and that multi graders
are not nested. What depends on the server (is a judge model served, is an
embedding model configured, can the sandbox start) is checked by
``runner.check_grader`` with a GradingContext.

Operators add types with ``register_grader_type``; tenants pick one by its
``type`` name and never name import paths.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from areal_marlaas.graders.errors import GraderError
from areal_marlaas.graders.formula import FUNCS, Formula, parse_formula
from areal_marlaas.graders.templates import Template, parse_template

# OpenAI's documented python grader limit.
MAX_SOURCE_BYTES = 256 * 1024
MAX_NAME_CHARS = 256

STRING_CHECK_OPERATIONS = ("eq", "ne", "like", "ilike")
TEXT_SIMILARITY_METRICS = (
    "fuzzy_match",
    "bleu",
    "gleu",
    "meteor",
    "cosine",
    "rouge_1",
    "rouge_2",
    "rouge_3",
    "rouge_4",
    "rouge_5",
    "rouge_l",
)
ROLES = ("user", "assistant", "system", "developer")
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Grader:
    name: str
    type: ClassVar[str] = ""


@dataclass(frozen=True)
class StringCheckGrader(Grader):
    input: Template
    reference: Template
    operation: str
    type: ClassVar[str] = "string_check"


@dataclass(frozen=True)
class TextSimilarityGrader(Grader):
    input: Template
    reference: Template
    evaluation_metric: str
    type: ClassVar[str] = "text_similarity"


@dataclass(frozen=True)
class PythonGrader(Grader):
    source: str
    image_tag: str | None = None
    type: ClassVar[str] = "python"


@dataclass(frozen=True)
class Message:
    role: str
    # A template, or a list of text parts ({"type": "input_text", "text": ...}).
    content: Template | tuple[tuple[str, Template], ...]
    type: str | None = None

    def render(self, sample: dict, item: dict) -> str:
        if isinstance(self.content, Template):
            return self.content.render(sample, item)
        return "".join(t.render(sample, item) for _, t in self.content)


@dataclass(frozen=True)
class ScoreModelGrader(Grader):
    model: str
    input: tuple[Message, ...]
    range: tuple[float, float] = (0.0, 1.0)
    sampling_params: dict[str, Any] = field(default_factory=dict)
    type: ClassVar[str] = "score_model"


@dataclass(frozen=True)
class MultiGrader(Grader):
    graders: dict[str, Grader]
    calculate_output: Formula
    type: ClassVar[str] = "multi"


@dataclass(frozen=True)
class ExtensionGrader(Grader):
    """A type added with ``register_grader_type``; ``config`` is its parse_fn's."""

    type_name: str
    config: Any
    spec: dict = field(repr=False)  # may hold secrets (an endpoint's headers)

    @property
    def type(self) -> str:  # type: ignore[override]
        return self.type_name


# --- extension registry ----------------------------------------------------

ParseFn = Callable[[dict, str], Any]
# run_fn(config, sample, item, ctx) -> float, or an awaitable of one.
RunFn = Callable[..., Any]
_EXTENSIONS: dict[str, tuple[ParseFn, RunFn]] = {}
BUILTIN_TYPES = ("string_check", "text_similarity", "python", "score_model", "multi")


def register_grader_type(type_name: str, parse_fn: ParseFn, run_fn: RunFn) -> None:
    """Add grader ``type_name``: ``parse_fn(spec, param)`` validates a spec (raise
    GraderError) and returns a config; ``run_fn(config, sample, item, ctx)`` returns
    the reward (a float, or an awaitable of one). Register in every process that
    parses or runs graders (GradingContext.extension_modules imports a module that
    registers, in pool workers too)."""
    if type_name in BUILTIN_TYPES:
        raise ValueError(f"grader type {type_name!r} is built in; pick another name")
    if not _KEY.fullmatch(type_name):
        raise ValueError(f"grader type name must be an identifier, got {type_name!r}")
    _EXTENSIONS[type_name] = (parse_fn, run_fn)


def unregister_grader_type(type_name: str) -> None:
    _EXTENSIONS.pop(type_name, None)


def extension_run_fn(type_name: str) -> RunFn:
    return _EXTENSIONS[type_name][1]


def grader_types() -> tuple[str, ...]:
    return BUILTIN_TYPES + tuple(sorted(_EXTENSIONS))


# --- parsing ----------------------------------------------------------------


def _type_name(value: object) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean"}.get(
        type(value),
        "number" if isinstance(value, int | float) else type(value).__name__,
    )


def _check_fields(
    spec: object, param: str, required: tuple[str, ...], optional: tuple[str, ...]
) -> dict:
    if not isinstance(spec, dict):
        raise GraderError(f"{param} must be an object, got {_type_name(spec)}", param)
    allowed = ("type",) + required + optional
    for key in spec:
        if key not in allowed:
            raise GraderError(
                f"{param}.{key}: unknown field for a {spec.get('type')} grader; "
                f"allowed fields: {', '.join(allowed)}",
                f"{param}.{key}",
            )
    for key in required:
        if key not in spec:
            raise GraderError(
                f"{param}.{key} is required for a {spec.get('type')} grader",
                f"{param}.{key}",
            )
    return spec


def _string(spec: dict, key: str, param: str, nonempty: bool = False) -> str:
    value = spec[key]
    if not isinstance(value, str):
        raise GraderError(
            f"{param}.{key} must be a string, got {_type_name(value)}", f"{param}.{key}"
        )
    if nonempty and not value.strip():
        raise GraderError(f"{param}.{key} must not be empty", f"{param}.{key}")
    return value


def _name(spec: dict, param: str) -> str:
    name = _string(spec, "name", param, nonempty=True)
    if len(name) > MAX_NAME_CHARS:
        raise GraderError(
            f"{param}.name is {len(name)} characters; the limit is {MAX_NAME_CHARS}",
            f"{param}.name",
        )
    return name


def _choice(spec: dict, key: str, param: str, choices: tuple[str, ...]) -> str:
    value = _string(spec, key, param)
    if value not in choices:
        raise GraderError(
            f"{param}.{key}: unknown value {value!r}; use one of {', '.join(choices)}",
            f"{param}.{key}",
        )
    return value


def parse_grader(spec: dict, param: str = "grader") -> Grader:
    """Parse a grader spec (as it arrives in JSON); GraderError on anything wrong."""
    return _parse(spec, param, allow_multi=True)


def _parse(spec: object, param: str, allow_multi: bool) -> Grader:
    if not isinstance(spec, dict):
        raise GraderError(f"{param} must be an object, got {_type_name(spec)}", param)
    if "type" not in spec:
        raise GraderError(
            f"{param}.type is required; one of {', '.join(grader_types())}",
            f"{param}.type",
        )
    kind = spec["type"]
    if not isinstance(kind, str) or kind not in grader_types():
        raise GraderError(
            f"{param}.type: unknown grader type {kind!r}; use one of "
            f"{', '.join(grader_types())}",
            f"{param}.type",
        )
    if kind == "multi" and not allow_multi:
        raise GraderError(
            f"{param}: multi graders cannot be nested; a multi grader's sub-graders "
            "are string_check, text_similarity, python or score_model graders",
            f"{param}.type",
        )
    if kind in _EXTENSIONS:
        config = _EXTENSIONS[kind][0](spec, param)
        name = spec.get("name")
        return ExtensionGrader(
            name=name if isinstance(name, str) and name else kind,
            type_name=kind,
            config=config,
            spec=dict(spec),
        )
    return _PARSERS[kind](spec, param)


def _parse_string_check(spec: dict, param: str) -> StringCheckGrader:
    _check_fields(spec, param, ("name", "input", "reference", "operation"), ())
    return StringCheckGrader(
        name=_name(spec, param),
        input=parse_template(spec["input"], f"{param}.input"),
        reference=parse_template(spec["reference"], f"{param}.reference"),
        operation=_choice(spec, "operation", param, STRING_CHECK_OPERATIONS),
    )


def _parse_text_similarity(spec: dict, param: str) -> TextSimilarityGrader:
    _check_fields(spec, param, ("name", "input", "reference", "evaluation_metric"), ())
    return TextSimilarityGrader(
        name=_name(spec, param),
        input=parse_template(spec["input"], f"{param}.input"),
        reference=parse_template(spec["reference"], f"{param}.reference"),
        evaluation_metric=_choice(
            spec, "evaluation_metric", param, TEXT_SIMILARITY_METRICS
        ),
    )


def _parse_python(spec: dict, param: str) -> PythonGrader:
    _check_fields(spec, param, ("name", "source"), ("image_tag",))
    source = _string(spec, "source", param, nonempty=True)
    size = len(source.encode("utf-8"))
    if size > MAX_SOURCE_BYTES:
        raise GraderError(
            f"{param}.source is {size} bytes; the limit is {MAX_SOURCE_BYTES} "
            "(256 kB): shorten it",
            f"{param}.source",
        )
    try:
        compile(source, "<grader>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as e:
        line = getattr(e, "lineno", None)
        where = f" (line {line})" if line else ""
        raise GraderError(
            f"{param}.source does not compile{where}: {e}", f"{param}.source"
        ) from None
    image_tag = spec.get("image_tag")
    if image_tag is not None and not isinstance(image_tag, str):
        raise GraderError(
            f"{param}.image_tag must be a string, got {_type_name(image_tag)}",
            f"{param}.image_tag",
        )
    return PythonGrader(name=_name(spec, param), source=source, image_tag=image_tag)


def _parse_message(msg: object, param: str) -> Message:
    if not isinstance(msg, dict):
        raise GraderError(
            f"{param} must be a message object {{role, content}}, got "
            f"{_type_name(msg)}",
            param,
        )
    _check_fields(msg, param, ("role", "content"), ())
    role = _choice(msg, "role", param, ROLES)
    if "type" in msg and msg["type"] != "message":
        raise GraderError(
            f"{param}.type must be 'message' (or left out), got {msg['type']!r}",
            f"{param}.type",
        )
    content = msg["content"]
    cparam = f"{param}.content"
    if isinstance(content, str):
        return Message(role, parse_template(content, cparam), msg.get("type"))
    if isinstance(content, dict):
        content = [content]
    if not isinstance(content, list) or not content:
        raise GraderError(
            f"{cparam} must be a string or a non-empty list of text parts", cparam
        )
    parts = []
    for i, part in enumerate(content):
        pparam = f"{cparam}.{i}"
        if isinstance(part, str):
            parts.append(("input_text", parse_template(part, pparam)))
            continue
        if not isinstance(part, dict):
            raise GraderError(f"{pparam} must be a string or an object", pparam)
        ptype = part.get("type")
        if ptype not in ("input_text", "output_text"):
            raise GraderError(
                f"{pparam}.type: {ptype!r} is not supported here: judges on this "
                "service are text-only; use input_text or output_text parts",
                f"{pparam}.type",
            )
        _check_fields(part, pparam, ("text",), ())
        parts.append((ptype, parse_template(part["text"], f"{pparam}.text")))
    return Message(role, tuple(parts), msg.get("type"))


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _parse_sampling_params(value: object, param: str) -> dict[str, Any]:
    if value is None:
        return {}
    spec = _check_fields(
        value,
        param,
        (),
        ("temperature", "max_completions_tokens", "top_p", "seed", "reasoning_effort"),
    )
    out: dict[str, Any] = {}
    for key, v in spec.items():
        if v is None:
            continue
        p = f"{param}.{key}"
        if key == "temperature" and not (_number(v) and 0 <= v <= 2):
            raise GraderError(f"{p} must be a number in [0, 2], got {v!r}", p)
        if key == "top_p" and not (_number(v) and 0 < v <= 1):
            raise GraderError(f"{p} must be a number in (0, 1], got {v!r}", p)
        if key == "max_completions_tokens" and not (
            isinstance(v, int) and not isinstance(v, bool) and v >= 1
        ):
            raise GraderError(f"{p} must be a positive integer, got {v!r}", p)
        if key == "seed" and not (isinstance(v, int) and not isinstance(v, bool)):
            raise GraderError(f"{p} must be an integer, got {v!r}", p)
        if key == "reasoning_effort" and v not in REASONING_EFFORTS:
            raise GraderError(
                f"{p}: unknown value {v!r}; use one of {', '.join(REASONING_EFFORTS)}",
                p,
            )
        out[key] = v
    return out


def _parse_score_model(spec: dict, param: str) -> ScoreModelGrader:
    _check_fields(spec, param, ("name", "model", "input"), ("range", "sampling_params"))
    model = _string(spec, "model", param, nonempty=True)
    messages = spec["input"]
    if not isinstance(messages, list) or not messages:
        raise GraderError(
            f"{param}.input must be a non-empty list of {{role, content}} messages",
            f"{param}.input",
        )
    parsed = tuple(
        _parse_message(m, f"{param}.input.{i}") for i, m in enumerate(messages)
    )
    rng = spec.get("range")
    if rng is None:
        lo, hi = 0.0, 1.0
    else:
        if not (
            isinstance(rng, list)
            and len(rng) == 2
            and all(_number(x) and math.isfinite(x) for x in rng)
        ):
            raise GraderError(
                f"{param}.range must be two finite numbers [low, high], got {rng!r}",
                f"{param}.range",
            )
        lo, hi = float(rng[0]), float(rng[1])
        if not lo < hi:
            raise GraderError(
                f"{param}.range: low must be below high, got [{rng[0]}, {rng[1]}]",
                f"{param}.range",
            )
    return ScoreModelGrader(
        name=_name(spec, param),
        model=model,
        input=parsed,
        range=(lo, hi),
        sampling_params=_parse_sampling_params(
            spec.get("sampling_params"), f"{param}.sampling_params"
        ),
    )


def _parse_multi(spec: dict, param: str) -> MultiGrader:
    _check_fields(spec, param, ("name", "graders", "calculate_output"), ())
    subs = spec["graders"]
    gparam = f"{param}.graders"
    if not isinstance(subs, dict) or not subs:
        raise GraderError(
            f"{gparam} must be a non-empty object mapping keys to graders, e.g. "
            '{"a": {"type": "string_check", ...}}',
            gparam,
        )
    if isinstance(subs.get("type"), str):
        raise GraderError(
            f'{gparam} must map keys to graders ({{"key": {{...}}}}), not be one '
            "grader: put it under a key and use the key in calculate_output",
            gparam,
        )
    graders: dict[str, Grader] = {}
    for key, sub in subs.items():
        if not _KEY.fullmatch(key) or key in FUNCS:
            raise GraderError(
                f"{gparam}: key {key!r} must be an identifier (letters, digits, '_'; "
                f"not starting with a digit) and not a function name "
                f"({', '.join(sorted(FUNCS))}), so calculate_output can use it",
                f"{gparam}.{key}",
            )
        graders[key] = _parse(sub, f"{gparam}.{key}", allow_multi=False)
    formula = parse_formula(
        spec["calculate_output"], set(graders), f"{param}.calculate_output"
    )
    return MultiGrader(
        name=_name(spec, param), graders=graders, calculate_output=formula
    )


_PARSERS: dict[str, Callable[[dict, str], Grader]] = {
    "string_check": _parse_string_check,
    "text_similarity": _parse_text_similarity,
    "python": _parse_python,
    "score_model": _parse_score_model,
    "multi": _parse_multi,
}


# --- back to JSON -----------------------------------------------------------


def _message_to_dict(m: Message) -> dict:
    if isinstance(m.content, Template):
        content: object = m.content.source
    else:
        content = [{"type": t, "text": tpl.source} for t, tpl in m.content]
    out: dict[str, Any] = {"role": m.role, "content": content}
    if m.type is not None:
        out["type"] = m.type
    return out


def grader_to_dict(g: Grader) -> dict:
    """The grader as OpenAI JSON (defaults filled in, e.g. score_model's range)."""
    if isinstance(g, ExtensionGrader):
        return dict(g.spec)
    out: dict[str, Any] = {"type": g.type, "name": g.name}
    if isinstance(g, StringCheckGrader):
        out.update(
            input=g.input.source, reference=g.reference.source, operation=g.operation
        )
    elif isinstance(g, TextSimilarityGrader):
        out.update(
            input=g.input.source,
            reference=g.reference.source,
            evaluation_metric=g.evaluation_metric,
        )
    elif isinstance(g, PythonGrader):
        out["source"] = g.source
        if g.image_tag is not None:
            out["image_tag"] = g.image_tag
    elif isinstance(g, ScoreModelGrader):
        out.update(
            model=g.model,
            input=[_message_to_dict(m) for m in g.input],
            range=list(g.range),
        )
        if g.sampling_params:
            out["sampling_params"] = dict(g.sampling_params)
    elif isinstance(g, MultiGrader):
        out.update(
            graders={k: grader_to_dict(v) for k, v in g.graders.items()},
            calculate_output=g.calculate_output.source,
        )
    return out
