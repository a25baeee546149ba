"""The README's cheap commands, run as a new user runs them from a clean
checkout, write nothing into the tracked tree (results go to the ignored
``runs/``)."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tests.support.paths import REPO

# Rows of the README's command table that take seconds, as a user types them
# (simulate-service takes 30 s; its default output folder is test_cli's).
CHEAP = [
    "marlaas check --config configs/quickstart.yaml",
    "marlaas simulate docs/results/bench",
    "marlaas config-docs",
]


def git(*args: str, cwd) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, check=True
    ).stdout


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    """This tree's files (tracked, and new ones not ignored) as a fresh
    repository with one commit and a clean status."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs git and a git checkout")
    files = git(
        "ls-files", "-z", "--cached", "--others", "--exclude-standard", cwd=REPO
    )
    root = tmp_path_factory.mktemp("checkout")
    for name in filter(None, files.split("\0")):
        src = REPO / name
        if src.is_file():  # a deleted, not yet staged file is listed too
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, root / name)
    git("init", "-q", cwd=root)
    git("add", "-A", cwd=root)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x", cwd=root)
    assert git("status", "--porcelain", cwd=root) == ""
    return root


def test_the_cheap_commands_are_the_readmes():
    readme = (REPO / "README.md").read_text()
    for command in CHEAP:
        assert f"`{command.split(' --')[0]}" in readme, command


@pytest.mark.parametrize("command", CHEAP)
def test_a_cheap_command_leaves_git_status_clean(checkout, command):
    argv = command.split()
    out = subprocess.run(
        [sys.executable, "-m", "areal_marlaas.cli", *argv[1:]],
        cwd=checkout,
        capture_output=True,
        text=True,
        timeout=300,
    )

    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert git("status", "--porcelain", "--untracked-files=all", cwd=checkout) == ""
