"""Adapters pushed to a server's node when the run directory is not shared
(``scheduler.ray.adapter_transport=push``): the driver reads a committed
version's files, each rollout worker writes them at the same path on its own
node (a new folder renamed into place, so its server never reads half a
version) and deletes them once the version is unloaded.

Only what vLLM reads travels (PEFT's ``adapter_*`` files), never the task's
optimizer state, which stays with the trainer.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from pathlib import Path

from areal.utils import logging

logger = logging.getLogger("MARLaaSStaging")


class Files(dict[str, bytes]):
    """File name -> bytes, with a short repr: the RPC layers log their
    arguments, and an adapter's bytes would be formatted in full."""

    def __repr__(self) -> str:
        return f"<adapter files: {sorted(self)}, {sum(map(len, self.values()))} bytes>"


def served_files(folder: str | Path) -> Files:
    """The files of ``folder`` a vLLM server loads (``adapter_config.json``,
    ``adapter_model.safetensors``, ...)."""
    folder = Path(folder)
    files = Files(
        (p.name, p.read_bytes())
        for p in sorted(folder.iterdir())
        if p.is_file() and p.name.startswith(("adapter_", "new_embeddings"))
    )
    if "adapter_config.json" not in files:
        raise FileNotFoundError(f"{folder} holds no adapter_config.json")
    return files


def digest(files: dict[str, bytes]) -> str:
    """sha256 over the files' names and bytes, in name order."""
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(name.encode() + b"\0")
        h.update(hashlib.sha256(files[name]).digest())
    return h.hexdigest()


def read_digest(folder: str | Path) -> str:
    """The digest of what is on this node's disk at ``folder``."""
    return digest(served_files(folder))


def stage(folder: str | Path, files: dict[str, bytes]) -> bool:
    """Put ``files`` at ``folder`` on this node; True when written here,
    False when the folder already held exactly these files (a shared mount, or
    a version staged before a restart)."""
    folder = Path(folder)
    if folder.is_dir():
        try:
            if read_digest(folder) == digest(files):
                return False
        except FileNotFoundError:
            pass
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.with_name(f".{folder.name}.{uuid.uuid4().hex[:8]}.tmp")
    tmp.mkdir()
    try:
        for name, data in files.items():
            if "/" in name or name.startswith("."):
                raise ValueError(f"bad adapter file name {name!r}")
            with open(tmp / name, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        old = None
        if folder.exists():  # a different version under this name: replace it
            old = folder.with_name(f".{folder.name}.{uuid.uuid4().hex[:8]}.old")
            folder.rename(old)
        tmp.rename(folder)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return True


def unstage(folder: str | Path) -> None:
    """Delete a pushed version from this node."""
    shutil.rmtree(folder, ignore_errors=True)
    logger.info(f"deleted pushed adapter {folder}")
