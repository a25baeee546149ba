"""``{{ namespace.path }}`` templates, as OpenAI graders write them.

A template is plain text with ``{{ item.x }}``, ``{{ item.a.b }}``,
``{{ sample.output_text }}`` or ``{{ sample.output_json.x }}`` references
(whitespace inside the braces optional; a numeric path part indexes a list).
Rendering only looks values up: there are no expressions, filters or calls, so a
tenant's template cannot run anything. A string value is inserted as is; any
other value as JSON.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from areal_marlaas.graders.errors import GraderError

NAMESPACES = ("item", "sample")
# What the sample namespace holds (see runner.build_sample).
SAMPLE_FIELDS = ("output_text", "output_json", "output_tools")

_REF = re.compile(r"\{\{(.*?)\}\}", re.S)
_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*|\d+")


class TemplateError(Exception):
    """A reference could not be resolved at grading time."""

    def __init__(self, message: str, sample_parse: bool = False):
        super().__init__(message)
        # True when the missing value is output_json of a non-JSON sample.
        self.sample_parse = sample_parse


@dataclass(frozen=True)
class Ref:
    text: str  # the reference as written, braces included
    namespace: str
    path: tuple[str, ...]


@dataclass(frozen=True)
class Template:
    source: str
    parts: tuple[str | Ref, ...]

    @property
    def refs(self) -> list[Ref]:
        return [p for p in self.parts if isinstance(p, Ref)]

    def render(self, sample: dict, item: dict) -> str:
        out = []
        for part in self.parts:
            if isinstance(part, str):
                out.append(part)
            else:
                value = resolve(part, sample, item, self.source)
                out.append(value if isinstance(value, str) else _json(value))
        return "".join(out)


def _json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False)


def parse_template(text: object, param: str) -> Template:
    """Parse ``text``; a malformed reference raises GraderError naming ``param``."""
    if not isinstance(text, str):
        raise GraderError(
            f"{param} must be a string (a template), got {type(text).__name__}", param
        )
    parts: list[str | Ref] = []
    pos = 0
    for m in _REF.finditer(text):
        if m.start() > pos:
            parts.append(text[pos : m.start()])
        parts.append(_parse_ref(m.group(0), m.group(1), param))
        pos = m.end()
    rest = text[pos:]
    if "{{" in rest:
        raise GraderError(
            f"{param}: unclosed '{{{{' in template {text!r}; close it with '}}}}'",
            param,
        )
    if rest:
        parts.append(rest)
    return Template(text, tuple(parts))


def _parse_ref(raw: str, inner: str, param: str) -> Ref:
    dotted = inner.strip()
    pieces = dotted.split(".") if dotted else []
    if len(pieces) < 2 or not all(_PATH.fullmatch(p) for p in pieces):
        raise GraderError(
            f"{param}: bad template reference {raw!r}; write "
            "'{{ item.field }}' or '{{ sample.output_text }}' (a namespace, then "
            "dot-separated keys; no expressions)",
            param,
        )
    namespace, path = pieces[0], tuple(pieces[1:])
    if namespace not in NAMESPACES:
        raise GraderError(
            f"{param}: template reference {raw!r} uses namespace {namespace!r}; "
            f"only {' and '.join(NAMESPACES)} exist",
            param,
        )
    if namespace == "sample" and path[0] not in SAMPLE_FIELDS:
        raise GraderError(
            f"{param}: template reference {raw!r}: the sample has "
            f"{', '.join(SAMPLE_FIELDS)}, not {path[0]!r}",
            param,
        )
    return Ref(raw, namespace, path)


def resolve(ref: Ref, sample: dict, item: dict, template: str) -> object:
    """The value ``ref`` names; TemplateError (naming the key) if it is missing."""
    value: object = sample if ref.namespace == "sample" else item
    walked = ref.namespace
    for key in ref.path:
        if isinstance(value, dict) and key in value:
            value = value[key]
        elif isinstance(value, list) and key.isdigit() and int(key) < len(value):
            value = value[int(key)]
        else:
            no_json = walked == "sample.output_json" and value is None
            why = (
                "the sample is not a JSON object"
                if no_json
                else f"{walked} has no key {key!r}"
            )
            raise TemplateError(
                f"template {template!r}: {ref.text} cannot be resolved: {why}",
                sample_parse=no_json,
            )
        walked = f"{walked}.{key}"
    if walked == "sample.output_json" and value is None:
        raise TemplateError(
            f"template {template!r}: {ref.text} cannot be resolved: the sample is "
            "not a JSON object",
            sample_parse=True,
        )
    return value
