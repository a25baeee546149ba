"""The base class the engine mixins type-check against.

Each mixin in this package sits before AReaL's ``FSDPPPOActor`` in an MRO and
reads its attributes (``config``, ``model``, ``parallel_helper``, ...) and
``super()`` methods. For the type checker the mixins derive from it; at run
time from ``object``, so they stay mixins.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from areal.api.cli_args import PPOActorConfig
    from areal.engine.fsdp_engine import FSDPPPOActor

    class EngineHost(FSDPPPOActor):
        config: PPOActorConfig  # FSDPPPOActor.__init__ takes one

else:
    EngineHost = object

__all__ = ["EngineHost"]
