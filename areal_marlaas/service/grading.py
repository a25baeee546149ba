"""Graders for service jobs: OpenAI's types (``areal_marlaas.graders``) plus the
operator's ``{"type": "marlaas", "kind": K}``, which scores with a built-in task
kind's reward (and, for a kind with its own workflow, rolls out with it).

Tenants choose among what the operator lists in ``service.grader_kinds``; they
never name an import path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from areal.utils.dynamic_import import import_from_string

from areal_marlaas.graders import (
    ExtensionGrader,
    GraderError,
    GradingContext,
    MultiGrader,
    register_grader_type,
    validate_grader,
)
from areal_marlaas.tasks import KINDS

MARLAAS = "marlaas"
# This module registers the type when imported: list it in
# GradingContext.extension_modules so reward workers know it too.
EXTENSION_MODULE = __name__


def _parse(spec: dict, param: str) -> dict[str, Any]:
    extra = sorted(set(spec) - {"type", "name", "kind"})
    if extra:
        raise GraderError(
            f"{param}.{extra[0]}: unknown field in a marlaas grader (it takes "
            "name and kind).",
            f"{param}.{extra[0]}",
        )
    if "name" in spec and not isinstance(spec["name"], str):
        raise GraderError(f"{param}.name must be a string.", f"{param}.name")
    kind = spec.get("kind")
    if kind not in KINDS:
        raise GraderError(
            f"{param}.kind must be one of {sorted(KINDS)}, got {kind!r}.",
            f"{param}.kind",
        )
    return {"kind": kind, "reward_fn": KINDS[kind].reward_fn}


def _run(config: dict[str, Any], sample: dict, item: dict, ctx) -> float:
    fn = import_from_string(config["reward_fn"])
    row = {k: v for k, v in item.items() if k not in ("prompt", "completions")}
    return float(fn("", sample.get("output_text", ""), None, None, **row))


register_grader_type(MARLAAS, _parse, _run)


def marlaas_kind(grader: dict) -> str | None:
    """The kind of a top-level marlaas grader (it decides the job's task kind)."""
    return grader.get("kind") if grader.get("type") == MARLAAS else None


def service_grader_validator(
    kinds: list[str], ctx: GradingContext
) -> Callable[[dict], None]:
    """Raise ``GraderError`` (``.param`` a dotted path under
    ``method.reinforcement.grader``) for a grader this service cannot run."""
    allowed = set(kinds)
    where = "method.reinforcement.grader"

    def check_kinds(grader, param: str) -> None:
        if isinstance(grader, MultiGrader):
            for key, sub in grader.graders.items():
                if isinstance(sub, ExtensionGrader) and sub.type_name == MARLAAS:
                    raise GraderError(
                        f"{param}.graders.{key}: a marlaas grader selects the job's "
                        "task kind; use it as the job's only grader.",
                        f"{param}.graders.{key}.type",
                    )
                check_kinds(sub, f"{param}.graders.{key}")
        elif (
            isinstance(grader, ExtensionGrader)
            and grader.type_name == MARLAAS
            and grader.config["kind"] not in allowed
        ):
            raise GraderError(
                f"{param}.kind: this service grades kinds {sorted(allowed)}, "
                f"got {grader.config['kind']!r}.",
                f"{param}.kind",
            )

    def validate(spec: dict) -> None:
        grader = validate_grader(spec, ctx, param=where)
        check_kinds(grader, where)

    return validate
