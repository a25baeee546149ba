"""The configuration schema (dataclasses with ``help`` metadata, validated in
``__post_init__``, one error type: ``ConfigError``) and its loader.

Modules: ``tasks`` (a tenant task), ``server`` (the vLLM server), ``scheduler``
(modes and admission), ``fault`` (fault tolerance), ``run`` (``MARLaaSConfig``,
the whole run), ``bench`` (``marlaas bench``), ``loader`` (YAML + overrides through
hydra's public API), ``reference`` (the generated docs/config.md). Nothing here
imports launcher code.
"""

from areal_marlaas.config.audit import AuditConfig
from areal_marlaas.config.bench import BenchConfig, BenchRunConfig
from areal_marlaas.config.fault import FaultToleranceConfig
from areal_marlaas.config.loader import load_config, parse_args
from areal_marlaas.config.run import MARLaaSConfig
from areal_marlaas.config.scheduler import MARLaaSSchedulerConfig
from areal_marlaas.config.server import MultiLoRAvLLMConfig, RolloutServerConfig
from areal_marlaas.config.tasks import (
    SearchConfig,
    TaskDatasetConfig,
    TaskPPOConfig,
    TaskSpec,
)
from areal_marlaas.errors import ConfigError

__all__ = [
    "AuditConfig",
    "BenchConfig",
    "BenchRunConfig",
    "ConfigError",
    "FaultToleranceConfig",
    "MARLaaSConfig",
    "MARLaaSSchedulerConfig",
    "MultiLoRAvLLMConfig",
    "RolloutServerConfig",
    "SearchConfig",
    "TaskDatasetConfig",
    "TaskPPOConfig",
    "TaskSpec",
    "load_config",
    "parse_args",
]
