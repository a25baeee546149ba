"""Where the plugin keeps what it builds: venvs, downloads, prepared models.

Everything lives under one cache folder (``MARLAAS_CACHE``, default
``~/.cache/areal-marlaas``) so a fresh clone reuses what setup already built.
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"


def cache_dir() -> Path:
    root = os.environ.get("MARLAAS_CACHE")
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "areal-marlaas"


def models_dir() -> Path:
    return cache_dir() / "models"


def default_model_path() -> Path:
    return Path(os.environ.get("MARLAAS_MODEL") or models_dir() / DEFAULT_MODEL_NAME)


def vllm_python() -> str:
    """The rollout server's interpreter: ``MARLAAS_VLLM_PYTHON`` or the setup venv."""
    explicit = os.environ.get("MARLAAS_VLLM_PYTHON")
    if explicit:
        return explicit
    venv = os.environ.get("MARLAAS_VLLM_VENV") or str(cache_dir() / "venv-vllm")
    return str(Path(venv) / "bin" / "python")
