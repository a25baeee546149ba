"""Fair shares of the rollout server between tenants (``scheduler.rollout_order``).

The server batches every tenant's requests; first come, first served lets a
tenant with a huge batch hold back everyone's rollout behind its requests. With
``fair``, each rollout's requests carry a vLLM priority (lower is served
first; the server runs ``--scheduling-policy priority``): its tenant's virtual
token count when it starts, after VTC (Sheng et al., OSDI '24) with generated
tokens as the service.

* A tenant's counter is its generated tokens / weight, charged when a rollout
  returns (``RolloutDone.tokens``). Until then the rollout's estimate (its
  task's last batch, else its tenant's) counts as in flight, so the tenant's
  next rollout already ranks behind it.
* A tenant keeps its place while it has a task in the loop (rolling out,
  training, publishing: an RL tenant is never on the server without pause). One
  that joins with none (a first job, a resume) is lifted to the lowest counter of
  the tenants in the loop, so idle time banks no credit; and a counter is kept
  within two of the largest batches of the most served tenant's, so a tenant
  that demanded little for a while goes first but never monopolizes the server
  to catch up.
* Priorities are fixed per request when it is sent (vLLM preempts running
  requests only when it runs out of KV cache); ties go by arrival.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Protocol


class RolloutOrder(StrEnum):
    """``scheduler.rollout_order``: how the server orders tenants' requests."""

    FIFO = "fifo"  # first come, first served (every request at priority 0)
    FAIR = "fair"  # each request at its tenant's virtual token count


ROLLOUT_ORDERS = tuple(o.value for o in RolloutOrder)


class Roller(Protocol):
    """What the share reads of a task that rolls out."""

    name: str
    tenant: str  # "" = the task is its own tenant
    weight: float  # > 0 (the core checked it)


def _tenant(task: Roller) -> str:
    return task.tenant or task.name


class RolloutShare:
    """Per-tenant virtual generated tokens and the priority of each rollout."""

    def __init__(self) -> None:
        self.vtokens: dict[str, float] = {}  # tenant -> charged tokens / weight
        self._live: dict[str, set[str]] = {}  # tenant -> its tasks in the loop
        self._running: dict[str, tuple[str, float]] = {}  # task -> tenant, estimate
        self._flight: dict[str, float] = {}  # tenant -> estimates in flight
        self._floor = 0.0  # the counter of the last rollout started
        self._biggest = 0.0  # the largest batch charged (tokens / weight)
        self._task_tokens: dict[str, int] = {}  # task -> tokens of its last batch
        self._tenant_tokens: dict[str, int] = {}

    def estimate(self, task: Roller) -> float:
        """Tokens / weight one batch of ``task`` is expected to generate."""
        tokens = self._task_tokens.get(task.name)
        if tokens is None:
            tokens = self._tenant_tokens.get(_tenant(task), 0)
        return tokens / task.weight

    # -- tenants in the loop -------------------------------------------------------
    def join(self, task: Roller) -> None:
        """``task`` is in the loop (submitted or resumed). A tenant that had
        none is lifted to the lowest counter of the tenants in it."""
        tenant = _tenant(task)
        if not self._live.get(tenant):
            live = [
                self.vtokens.get(t, 0.0) for t, tasks in self._live.items() if tasks
            ]
            lift = min(live) if live else self._floor
            self.vtokens[tenant] = max(self.vtokens.get(tenant, 0.0), lift)
        self._live.setdefault(tenant, set()).add(task.name)

    def leave(self, task: Roller) -> None:
        """``task`` left the loop (ended or paused)."""
        tasks = self._live.get(_tenant(task))
        if tasks is not None:
            tasks.discard(task.name)

    # -- rollouts --------------------------------------------------------------------
    def start(self, task: Roller) -> int:
        """``task``'s rollout starts: the priority of its requests."""
        tenant = _tenant(task)
        counter = self.vtokens.get(tenant, 0.0)
        live = [self.vtokens.get(t, 0.0) for t, tasks in self._live.items() if tasks]
        if live:
            # Credit is capped at two of the largest batches behind the most
            # served tenant: one that demanded little for a while goes first,
            # but never monopolizes the server to catch up.
            counter = max(counter, max(live) - 2 * self._biggest)
        self.vtokens[tenant] = counter
        self._floor = max(self._floor, counter)
        priority = int(counter + self._flight.get(tenant, 0.0))
        est = self.estimate(task)
        self._running[task.name] = (tenant, est)
        self._flight[tenant] = self._flight.get(tenant, 0.0) + est
        return priority

    def end(self, task: Roller, tokens: int | None = None) -> None:
        """``task``'s rollout returned ``tokens`` (None: it failed or was dropped;
        its estimate is charged: the server did the work). A task with no
        rollout in flight is ignored."""
        running = self._running.pop(task.name, None)
        if running is None:
            return
        tenant, est = running
        self._flight[tenant] -= est
        charge = est
        if tokens is not None:
            charge = tokens / task.weight
            self._task_tokens[task.name] = tokens
            self._tenant_tokens[tenant] = tokens
        self._biggest = max(self._biggest, charge)
        self.vtokens[tenant] = self.vtokens.get(tenant, 0.0) + charge
