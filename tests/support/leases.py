"""A registry listener that records what the product no longer stores."""

from __future__ import annotations


class LeaseLog:
    """A registry listener that keeps every lease, publish and retire (tests read
    what the product no longer stores)."""

    def __init__(self):
        self.leases: list[list] = []  # [name, start, end]
        self.published_at: dict[str, float] = {}
        self.retired_at: dict[str, float] = {}
        self._open: dict[str, list[list]] = {}

    def leased(self, name: str, start: float) -> None:
        rec = [name, start, None]
        self.leases.append(rec)
        self._open.setdefault(name, []).append(rec)

    def released(self, name: str, end: float) -> None:
        self._open[name].pop(0)[2] = end

    def published(self, name: str, at: float) -> None:
        self.published_at[name] = at

    def retired(self, name: str, at: float) -> None:
        self.retired_at[name] = at

    def inflight(self, name: str) -> int:
        return len(self._open.get(name, []))
