"""Fixtures of the in-process tests: tiny models, a search corpus and the job
store's databases."""

from __future__ import annotations

import json

import pytest

from tests.support import postgres as pg
from tests.support.search import CORPUS


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """Tiny random models of both architectures, built once per session."""
    from areal_marlaas.model_prep import make_tiny_model

    root = tmp_path_factory.mktemp("tiny")
    return {
        arch: make_tiny_model(root / arch, arch=arch) for arch in ("llama", "qwen3")
    }


@pytest.fixture(scope="session")
def corpus_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in CORPUS))
    return path


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path):
    """The job store's database: a SQLite file, or a new database on the
    session's PostgreSQL server."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'service.db'}"
    return pg.fresh_database(request.getfixturevalue("postgres"))
