"""``--config X.yaml [--tasks T.yaml] [key=value ...]`` -> a validated config.

Composition goes through hydra's public API: the schema dataclass, the main YAML
and the tasks YAML are the defaults list of one primary config held in hydra's
``ConfigStore``, and ``compose(overrides=...)`` applies the overrides to the typed
result. So every field, defaults included, takes ``key=value``; a misspelt key or
a wrong type is refused by the schema; ``defaults:`` lists and interpolation in
the YAML work as in any hydra app.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import (
    ConfigAttributeError,
    ConfigKeyError,
    OmegaConfBaseException,
)

from areal_marlaas.config.run import _UNUSED_SECTIONS, UNHONORED, MARLaaSConfig
from areal_marlaas.config.tasks import TaskSpec
from areal_marlaas.errors import ConfigError

C = TypeVar("C", bound=MARLaaSConfig)

# ConfigStore names of the pieces (unlikely to clash with a user's YAML name).
_SCHEMA = "marlaas-schema-{}"
_TASKS = "marlaas-tasks"
_PRIMARY = "marlaas-primary"


@dataclass
class ConfigArgs:
    config: Path
    tasks: str | None
    overrides: list[str]


def parse_args(argv: list[str]) -> ConfigArgs:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--config", required=True, help="Main YAML")
    parser.add_argument(
        "--tasks", default=None, help="Tasks YAML (overrides tasks_file)"
    )
    parser.add_argument(
        "--resume", action="store_true", help="Same as the override resume=true"
    )
    parser.add_argument(
        "--verbose", action="store_true", help="Same as the override verbose=true"
    )
    try:
        args, overrides = parser.parse_known_args(argv)
    except SystemExit:
        raise ConfigError("missing --config X.yaml") from None
    if args.resume:
        overrides.append("resume=true")
    if args.verbose:
        overrides.append("verbose=true")
    unknown = [o for o in overrides if o.startswith("--")]
    if unknown:
        raise ConfigError(
            f"unknown option(s) {unknown}; overrides look like key=value."
        )
    return ConfigArgs(Path(args.config).absolute(), args.tasks, overrides)


def resolve_tasks_path(tasks_file: str, config_file: Path) -> Path:
    """Relative paths: the working directory first, then beside the main YAML."""
    p = Path(tasks_file).expanduser()
    if p.is_absolute() or p.exists():
        return p.absolute()
    beside = config_file.parent / p
    return beside if beside.exists() else p.absolute()


def load_tasks_file(path: Path) -> ListConfig:
    if not path.is_file():
        raise ConfigError(f"tasks_file: {path} does not exist.")
    try:
        loaded = OmegaConf.load(path)
    except Exception as e:  # yaml errors come in many types
        raise ConfigError(f"tasks_file: {path} is not valid YAML: {e}") from e
    tasks = loaded.get("tasks") if isinstance(loaded, DictConfig) else loaded
    if not isinstance(tasks, ListConfig):
        raise ConfigError(
            f"tasks_file: {path} must hold a `tasks:` list (or be a list of tasks)."
        )
    check_task_fields(tasks, str(path))
    return tasks


def check_task_fields(tasks: ListConfig, where: str) -> None:
    """Unknown keys and wrong types, reported with the task and the field (the
    whole-config composition only names the field)."""
    schema = OmegaConf.structured(TaskSpec)
    for i, task in enumerate(tasks):
        if not isinstance(task, DictConfig):
            raise ConfigError(f"{where}: tasks.{i} must be a mapping, got {task!r}.")
        name = task.get("name", "?")
        try:
            OmegaConf.merge(schema, task)
        except OmegaConfBaseException as e:
            key = getattr(e, "full_key", None) or "?"
            raise ConfigError(
                f"{where}: tasks.{i} ({name!r}) field {key}: {str(e).splitlines()[0]}"
            ) from e


def _compose(config_dir: Path, name: str, overrides: list[str]) -> DictConfig:
    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        return compose(config_name=name, overrides=overrides)


def compose_yaml(config_file: Path, overrides: list[str] | None = None) -> DictConfig:
    """The main YAML alone (untyped), through hydra."""
    try:
        return _compose(config_file.parent, config_file.stem, overrides or [])
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(f"--config {config_file}: {_message(e)}") from e


def load_config(argv: list[str], schema: type[C] = MARLaaSConfig) -> tuple[C, Path]:
    """``--config X.yaml [--tasks T.yaml] [key=value ...]`` -> validated config."""
    args = parse_args(argv)
    if not args.config.is_file():
        raise ConfigError(f"--config: {args.config} does not exist.")
    raw = compose_yaml(args.config)
    tasks_file = args.tasks
    for o in args.overrides:
        if o.lstrip("+").startswith("tasks_file=") and not tasks_file:
            tasks_file = o.split("=", 1)[1]
    tasks_file = tasks_file or raw.get("tasks_file") or ""
    store = ConfigStore.instance()
    schema_name = _SCHEMA.format(schema.__name__)
    store.store(name=schema_name, node=schema)
    defaults: list[str] = [schema_name, args.config.stem]
    if tasks_file:
        if raw.get("tasks"):
            raise ConfigError(
                "tasks are given twice: inline `tasks:` in the main YAML and a tasks "
                f"file ({tasks_file}); keep one."
            )
        path = resolve_tasks_path(tasks_file, args.config)
        tasks = load_tasks_file(path)
        store.store(name=_TASKS, node={"tasks": tasks, "tasks_file": str(path)})
        defaults.append(_TASKS)
    elif isinstance(raw.get("tasks"), ListConfig):
        tasks = raw.tasks
        check_task_fields(tasks, str(args.config))
    else:
        tasks = None
    store.store(name=_PRIMARY, node={"defaults": [*defaults, "_self_"]})
    overrides = [
        o for o in args.overrides if not o.lstrip("+").startswith("tasks_file=")
    ]
    try:
        composed = _compose(args.config.parent, _PRIMARY, overrides)
        cfg = OmegaConf.to_object(composed)
    except ConfigError:
        raise
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(_name_task(_message(e), tasks)) from e
    except ValueError as e:  # AReaL's own __post_init__ checks
        raise ConfigError(str(e)) from e
    except Exception as e:  # OmegaConf re-raises some errors as plain types
        raise ConfigError(_name_task(_message(e), tasks)) from e
    assert isinstance(cfg, schema)
    return cfg, args.config


def _message(e: Exception) -> str:
    """One line naming the field: hydra wraps the OmegaConf error that has it."""
    cause = e
    while not isinstance(cause, OmegaConfBaseException) and cause.__cause__:
        cause = cause.__cause__
    if isinstance(cause, ConfigError):
        return str(cause)
    first = str(cause).splitlines()[0]
    key = getattr(cause, "full_key", None)
    if key is None:  # a plain error OmegaConf decorated with the key
        m = re.search(r"full_key: (\S+)", str(cause))
        key = m.group(1) if m else None
    refusal = _refusal(key) if key else None
    if refusal:
        return refusal
    if key and isinstance(cause, ConfigAttributeError | ConfigKeyError):
        return f"unknown field {key!r}: no such setting; check the spelling."
    return first + (f" [at {key}]" if key else "")


def _refusal(key: str) -> str | None:
    """The refusal text of a field the trainer cannot honor (a section that is
    None by default cannot even be composed, so it fails before validation)."""
    parts = key.split(".")
    if parts[0] in _UNUSED_SECTIONS:
        return (
            f"{parts[0]} is not used by marlaas (it would be ignored): "
            f"{_UNUSED_SECTIONS[parts[0]]}. Remove {parts[0]} from the config."
        )
    if len(parts) >= 2 and (parts[0], parts[1]) in UNHONORED:
        allowed, fix = UNHONORED[(parts[0], parts[1])]
        return (
            f"{parts[0]}.{parts[1]} cannot be honored by the multi-task trainer: "
            f"{fix}. Allowed: {list(allowed)}."
        )
    return None


def _name_task(msg: str, tasks: ListConfig | None) -> str:
    """Append the task name to errors that point into ``tasks[i]``."""
    m = re.search(r"tasks[\[.](\d+)", msg)
    if m and isinstance(tasks, ListConfig) and int(m.group(1)) < len(tasks):
        name = tasks[int(m.group(1))].get("name", "?")
        return f"{msg} (task {name!r})"
    return msg
