"""The configuration reference (``docs/config.md``), generated from the schema's
``help`` metadata, as AReaL's ``docs/generate_cli_docs.py`` does for its own.

``marlaas config-docs --out docs/config.md`` rewrites it; a test checks that the
committed file is what the code generates.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from areal_marlaas.config.bench import BenchConfig
from areal_marlaas.config.run import _UNUSED_SECTIONS, UNHONORED, MARLaaSConfig


def _sections() -> list[tuple[str, type, bool]]:
    """The sections the plugin defines, in reading order: (key in the YAML,
    dataclass, document only the fields the class itself adds)."""
    from areal_marlaas.config.audit import AuditConfig
    from areal_marlaas.config.cluster import RayClusterConfig, SlurmClusterConfig
    from areal_marlaas.config.fault import FaultToleranceConfig
    from areal_marlaas.config.scheduler import MARLaaSSchedulerConfig
    from areal_marlaas.config.server import MultiLoRAvLLMConfig, RolloutServerConfig
    from areal_marlaas.config.tasks import (
        SearchConfig,
        TaskDatasetConfig,
        TaskPPOConfig,
        TaskSpec,
    )

    out = [
        ("(top level)", MARLaaSConfig, True),
        ("tasks[i]", TaskSpec, False),
        ("tasks[i].dataset", TaskDatasetConfig, False),
        ("tasks[i].ppo", TaskPPOConfig, False),
        ("tasks[i].search", SearchConfig, False),
        ("server", RolloutServerConfig, False),
        ("vllm", MultiLoRAvLLMConfig, True),
        ("scheduler", MARLaaSSchedulerConfig, True),
        ("scheduler.ray", RayClusterConfig, False),
        ("scheduler.slurm", SlurmClusterConfig, False),
        ("fault", FaultToleranceConfig, False),
        ("audit", AuditConfig, False),
        ("bench (marlaas bench only)", BenchConfig, False),
    ]
    try:  # the service's section, when the service package is present
        from areal_marlaas.config.service import ServiceConfig

        out.append(("service (marlaas service only)", ServiceConfig, False))
        from areal_marlaas.config.bench_service import ServiceLoadConfig

        out.append(("load (marlaas bench-service only)", ServiceLoadConfig, False))
    except ImportError:
        pass
    return out


def _own_fields(cls: type, own_only: bool) -> list[dataclasses.Field]:
    fields = list(dataclasses.fields(cls))
    if not own_only:
        return fields
    parent = {
        f.name
        for base in cls.__mro__[1:]
        if dataclasses.is_dataclass(base)
        for f in dataclasses.fields(base)
    }
    overridden = set(vars(cls).get("__annotations__", {}))
    return [f for f in fields if f.name not in parent or f.name in overridden]


def _type_name(tp: Any) -> str:
    if isinstance(tp, str):
        return tp
    if typing.get_origin(tp) is not None or "|" in str(tp):
        return str(tp).replace("typing.", "")
    return getattr(tp, "__name__", None) or str(tp)


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
        if value == "???":  # omegaconf's MISSING
            return "required"
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
        if dataclasses.is_dataclass(value):
            return "(section)"
    else:
        return "required"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def generate() -> str:
    lines = [
        "# Configuration reference",
        "",
        "Generated from the schema's `help` metadata by `marlaas config-docs "
        "--out docs/config.md`; do not edit by hand. Every field takes a hydra "
        "override on the command line (`key=value`, task fields as "
        "`tasks.0.batch_size=8`).",
        "",
        "`MARLaaSConfig` extends AReaL's `GRPOConfig`: the AReaL sections "
        "(`actor`, `rollout`, `cluster`, `stats_logger`, `scheduler`, `vllm`, ...) "
        "keep AReaL's fields and meaning (see AReaL's CLI reference); below are "
        "the fields the plugin adds, and the AReaL fields it refuses.",
        "",
    ]
    hints_cache: dict[type, dict[str, Any]] = {}
    for key, cls, own_only in _sections():
        fields = _own_fields(cls, own_only)
        if not fields:
            continue
        if cls not in hints_cache:
            try:
                hints_cache[cls] = typing.get_type_hints(cls)
            except Exception:
                hints_cache[cls] = {}
        hints = hints_cache[cls]
        doc = " ".join((cls.__doc__ or "").split())
        lines += [f"## `{key}`", "", doc, "", "| field | type | default | meaning |"]
        lines.append("|---|---|---|---|")
        for f in fields:
            if f.name.startswith("_"):
                continue
            help_text = f.metadata.get("help", "")
            choices = f.metadata.get("choices")
            if choices:
                help_text += f" Choices: {', '.join(map(str, choices))}."
            tp = _type_name(hints.get(f.name, f.type))
            lines.append(
                f"| `{f.name}` | {_cell(tp)} | `{_cell(_default(f))}` | "
                f"{_cell(help_text)} |"
            )
        lines.append("")
    lines += [
        "## AReaL fields that are refused",
        "",
        "`marlaas check` and every command stop with an error naming the field "
        "when one of these is set: the multi-task trainer could not honor it.",
        "",
        "| field | allowed | why / instead |",
        "|---|---|---|",
    ]
    for name, fix in _UNUSED_SECTIONS.items():
        lines.append(f"| `{name}` | (unset) | {_cell(fix)} |")
    for (section, key), (allowed, fix) in UNHONORED.items():
        shown = ", ".join(f"`{a!r}`" for a in allowed)
        lines.append(f"| `{section}.{key}` | {shown} | {_cell(fix)} |")
    return "\n".join(lines) + "\n"
