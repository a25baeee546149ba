"""CPU placement: which cores the rollout server and the trainer may use.

On a CPU machine the paper's "devices" are core sets: the disaggregated modes pin
the vLLM server to one set and the trainer to another; collocated shares them.
"""

from __future__ import annotations

import os

from areal_marlaas.errors import ConfigError


def parse_cpus(spec: str, field: str) -> set[int]:
    """``"0"``, ``"0-3"`` or ``"0,2-3"`` -> core ids; empty -> empty set."""
    cpus: set[int] = set()
    for part in filter(None, (p.strip() for p in spec.split(","))):
        try:
            lo, _, hi = part.partition("-")
            first, last = int(lo), int(hi or lo)
        except ValueError:
            raise ConfigError(
                f"{field}={spec!r}: use core ids like '0', '0-3' or '0,2-3'."
            ) from None
        if first < 0 or last < first:
            raise ConfigError(f"{field}={spec!r}: bad core range {part!r}.")
        cpus.update(range(first, last + 1))
    return cpus


def pin_current_process(cpus: set[int]) -> set[int]:
    """Pin this process (and threads it starts later) to ``cpus`` that exist here;
    returns the cores actually used (all cores when none of ``cpus`` exists)."""
    available = os.sched_getaffinity(0)
    use = (cpus & available) or available
    os.sched_setaffinity(0, use)
    return use
