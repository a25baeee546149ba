"""Held-out splits of a synthetic problem space: a stable hash of a problem's
canonical key puts it on the test side or the train side, whatever the seed."""

from __future__ import annotations

import hashlib

SPLITS = ("train", "test")


def in_holdout(key: str, holdout: float) -> bool:
    """Whether the problem with canonical ``key`` is in the held-out fraction."""
    digest = hashlib.sha256(key.encode()).digest()
    return int.from_bytes(digest[:4], "little") / 2**32 < holdout


def check_split(split: str, holdout: float) -> None:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {list(SPLITS)}, got {split!r}")
    if not 0 <= holdout < 1:
        raise ValueError(f"holdout must be in [0, 1), got {holdout}")
    if split == "test" and holdout == 0:
        raise ValueError("the test split needs holdout > 0 (there is none otherwise)")
