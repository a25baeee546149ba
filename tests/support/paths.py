"""Where the tests find the checkout and the shared datasets."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHARED_DATA = Path(
    os.environ.get("MARLAAS_SHARED_DATA", REPO.parent / "shared" / "data")
)
