"""Numbers as the tables print them."""

from __future__ import annotations

from typing import Any


def fmt(v: Any, digits: int = 1, pct: bool = False) -> str:
    """``-`` for None, a percentage with ``pct``, floats to ``digits`` places."""
    if v is None:
        return "-"
    if pct:
        return f"{100 * v:.0f}%"
    return f"{v:.{digits}f}" if isinstance(v, float) else str(v)
