"""The default grader check for job creation (the graders module replaces it).

A grader validator is ``Callable[[dict], None]``: it returns on a grader the service
can run and raises :class:`GraderError` (a ``ValueError`` with ``.param``, the dotted
path of the bad field *inside the grader*, e.g. ``operation``) otherwise. The API
reports it as ``method.reinforcement.grader.<param>``.

Accepted here: OpenAI's ``string_check`` and ``{"type": "marlaas", "kind": K}``
for a built-in task kind K the operator lists in ``service.grader_kinds``.
"""

from __future__ import annotations

from collections.abc import Callable

STRING_CHECK_OPERATIONS = ("eq", "ne", "like", "ilike")


class GraderError(ValueError):
    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


def default_grader_validator(kinds: list[str]) -> Callable[[dict], None]:
    allowed = tuple(kinds)

    def validate(spec: dict) -> None:
        if not isinstance(spec, dict):
            raise GraderError("The grader must be an object with a 'type'.")
        gtype = spec.get("type")
        if gtype == "string_check":
            _string_check(spec)
        elif gtype == "marlaas":
            _marlaas(spec, allowed)
        else:
            raise GraderError(
                f"Unsupported grader type {gtype!r}; this service accepts "
                "'string_check' and 'marlaas'.",
                "type",
            )

    return validate


def _unknown(spec: dict, known: set[str]) -> None:
    extra = sorted(set(spec) - known)
    if extra:
        raise GraderError(
            f"Unknown field(s) {extra} in a {spec['type']} grader.", extra[0]
        )


def _string_check(spec: dict) -> None:
    _unknown(spec, {"type", "name", "input", "reference", "operation"})
    for key in ("name", "input", "reference"):
        if not isinstance(spec.get(key), str):
            raise GraderError(f"string_check needs '{key}', a string.", key)
    if spec.get("operation") not in STRING_CHECK_OPERATIONS:
        raise GraderError(
            f"string_check operation must be one of {list(STRING_CHECK_OPERATIONS)}, "
            f"got {spec.get('operation')!r}.",
            "operation",
        )


def _marlaas(spec: dict, allowed: tuple[str, ...]) -> None:
    _unknown(spec, {"type", "name", "kind"})
    if "name" in spec and not isinstance(spec["name"], str):
        raise GraderError("marlaas grader 'name' must be a string.", "name")
    if spec.get("kind") not in allowed:
        raise GraderError(
            f"marlaas grader kind must be one of {list(allowed)}, got "
            f"{spec.get('kind')!r}.",
            "kind",
        )
