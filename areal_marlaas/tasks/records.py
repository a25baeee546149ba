"""Reading dataset records from a local file/folder or a hub id."""

from __future__ import annotations

import json
import re
from pathlib import Path

# "owner/name" with no file suffix: a dataset hub id rather than a local path.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_SUFFIXES = (".jsonl", ".json")


def is_hub_id(path: str) -> bool:
    return bool(_HUB_ID.match(path)) and not path.endswith(_SUFFIXES)


def read_records(path: str, split: str, hub_config: str | None = None) -> list[dict]:
    """Records from ``<path>`` (.jsonl or a .json array), ``<path>/<split>.jsonl``,
    or, when ``path`` looks like ``owner/name`` and is not on disk, a hub dataset."""
    p = Path(path).expanduser()
    if p.is_dir():
        candidates = [p / f"{split}{s}" for s in _SUFFIXES]
        found = [c for c in candidates if c.is_file()]
        if not found:
            raise FileNotFoundError(f"{p} has no {split}.jsonl or {split}.json")
        p = found[0]
    if p.is_file():
        text = p.read_text()
        if p.suffix == ".json":
            data = json.loads(text)
            if not isinstance(data, list):
                raise ValueError(f"{p}: expected a JSON array of objects")
            return data
        records = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{p}:{n}: not valid JSON ({e.msg})") from e
        return records
    if is_hub_id(path):
        from datasets import load_dataset

        # A split's rows are dicts; datasets' stubs allow any of its types.
        return list(load_dataset(path, hub_config, split=split))  # pyright: ignore[reportReturnType]
    raise FileNotFoundError(f"no such file or folder: {p}")
