"""AReaL's one global staleness gate, opened: per-task on-policy is the MARLaaS
scheduler's job, and a global counter against one engine version would stall."""

from __future__ import annotations

import dataclasses

from areal.api.cli_args import InferenceEngineConfig

# The executor counts accepted rollouts against ONE engine version that never
# moves here.
_NO_GLOBAL_STALENESS_GATE = 10**9


def without_global_staleness_gate(
    config: InferenceEngineConfig,
) -> InferenceEngineConfig:
    return dataclasses.replace(
        config,
        max_head_offpolicyness=max(
            config.max_head_offpolicyness, _NO_GLOBAL_STALENESS_GATE
        ),
    )
