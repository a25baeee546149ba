"""Rules the test suite keeps, read from its own source and from pytest's
collection: no test module imports another, every test runs in exactly one
CI target, and no test decides on a wall-clock margin under 5x what it measured
here or on a gauge read in a polling loop."""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from _pytest.mark.expression import Expression

from tests.support.paths import REPO

TESTS = REPO / "tests"
PYPROJECT = REPO / "pyproject.toml"
TEST_FILES = sorted(TESTS.rglob("test_*.py"))


def source(path: Path) -> tuple[str, ast.Module]:
    text = path.read_text()
    return text, ast.parse(text, str(path))


# -- no test module imports another ------------------------------------------------
def test_no_test_module_imports_another_test_module():
    """Shared pieces live in tests/support (helpers) and conftest files
    (fixtures), where a reader looks for them."""
    found = []
    for path in TEST_FILES:
        _, tree = source(path)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
                if node.level:  # relative: a named module may be a sibling test module
                    names = [
                        f"{node.module or ''}.{a.name}".lstrip(".") for a in node.names
                    ]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                if any(part.startswith("test_") for part in name.split(".")):
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}: {name}")
    assert not found, "\n".join(found)


# -- every test in exactly one CI target -------------------------------------------
def ci_targets() -> list[str]:
    """The make targets ``.ci/run`` runs, in order."""
    text = (REPO / ".ci" / "run").read_text()
    return re.findall(r"^make ([\w-]+)\s*$", text, flags=re.M)


def pytest_args(target: str) -> list[str] | None:
    """The pytest arguments of a make target's recipe (None: it runs no
    pytest), with its make variables as empty as CI leaves them."""
    lines = (REPO / "Makefile").read_text().splitlines()
    start = lines.index(next(x for x in lines if x.startswith(f"{target}:")))
    recipe = []
    for line in lines[start + 1 :]:
        if not line.startswith("\t"):
            break
        recipe.append(line.strip())
    for line in recipe:
        if "-m pytest" in line:
            args = line.split("-m pytest", 1)[1]
            return shlex.split(re.sub(r"\$\([A-Z_]+\)", "", args))
    return None


def collected(tmp_path) -> dict[str, set[str]]:
    """Every test pytest collects here (slow ones too), with its markers."""
    dump = tmp_path / "markers.tsv"
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", ""]
        + ["-p", "no:cacheprovider", "-p", "tests.support.marker_dump"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
        env={**os.environ, "MARLAAS_MARKER_DUMP": str(dump)},
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    tests = {}
    for line in dump.read_text().splitlines():
        nodeid, markers = line.split("\t")
        tests[nodeid] = set(filter(None, markers.split(",")))
    return tests


def selected(args: list[str], tests: dict[str, set[str]]) -> set[str]:
    """What ``pytest ARGS`` selects of ``tests``: its last ``-m`` expression
    (else the one pyproject's addopts gives) and its paths (else all)."""
    addopts = shlex.split(
        re.search(r'^addopts = "(.*)"$', PYPROJECT.read_text(), re.M).group(1)
    )
    expr, paths = "", []
    for opts in (addopts, args):
        it = iter(opts)
        for a in it:
            if a == "-m":
                expr = next(it)
            elif not a.startswith("-"):
                paths.append(a.rstrip("/"))
    keep = Expression.compile(expr) if expr else None
    return {
        t
        for t, markers in tests.items()
        if (keep is None or keep.evaluate(lambda name, m=markers: name in m))
        and (
            not paths
            or any(t == p or t.startswith(p + "/") for p in paths)
            or any(t.startswith(p + "::") for p in paths)
        )
    }


def test_every_test_runs_in_exactly_one_ci_target(tmp_path):
    """What CI's targets select, against every test there is: each one exactly
    once (a slow test outside a target would never run anywhere)."""
    tests = collected(tmp_path)
    slow = {t for t, m in tests.items() if "slow" in m}
    assert slow, "no slow test collected: the check would prove nothing"
    targets = {t: pytest_args(t) for t in ci_targets()}
    selections = {t: selected(a, tests) for t, a in targets.items() if a is not None}
    assert set(selections) >= {"test", "test-live"}, targets
    seen: dict[str, list[str]] = {}
    for target, ids in selections.items():
        for test in ids:
            seen.setdefault(test, []).append(target)
    missing = sorted(set(tests) - set(seen))
    twice = {t: ts for t, ts in seen.items() if len(ts) > 1}
    assert not missing, f"in no CI target: {missing[:20]}"
    assert not twice, f"in several CI targets: {dict(list(twice.items())[:20])}"
    assert slow <= selections["test-live"]
    assert not slow & selections["test"]


# -- wall-clock bounds and polled gauges -------------------------------------------
# An expression measures wall-clock time if it reads a clock or names an elapsed
# time (took, wall, elapsed_s, duration_s, an interval ``end - start``).
CLOCKS = {"monotonic", "time", "perf_counter"}
ELAPSED = re.compile(
    r"^(took(_\w+)?|wall|elapsed(_s)?|\w+_elapsed|duration_s|took_s|max_gap_s)$"
)
STARTS = re.compile(r"(^|_)(start|t0|ready|began)$")
TYPICAL = re.compile(r"~?([0-9]*\.?[0-9]+) ?s here")
# Gauges: a reading of one moment, which a polling loop can miss.
GAUGES = {"kv_cache_usage", "requests_running", "requests_waiting"}


def _names(node: ast.AST) -> list[str]:
    out = []
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            out.append(n.id)
        elif isinstance(n, ast.Attribute):
            out.append(n.attr)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str):
            out.append(n.value)
    return out


def is_clock(node: ast.AST) -> bool:
    for n in ast.walk(node):
        if (
            isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute)
            and n.func.attr in CLOCKS
            and isinstance(n.func.value, ast.Name)
            and n.func.value.id == "time"
        ):
            return True
        if (
            isinstance(n, ast.BinOp)
            and isinstance(n.op, ast.Sub)
            and any(STARTS.search(x) for x in _names(n.right))
        ):
            return True
    return any(ELAPSED.match(x) for x in _names(node))


def upper_bounds(test: ast.Compare) -> list[tuple[ast.AST, ast.AST]]:
    """(measured, bound) pairs where ``measured`` must stay below ``bound``."""
    out = []
    left = test.left
    for op, right in zip(test.ops, test.comparators, strict=True):
        if isinstance(op, (ast.Lt, ast.LtE)):
            out.append((left, right))
        elif isinstance(op, (ast.Gt, ast.GtE)):
            out.append((right, left))
        left = right
    return out


def comment_near(lines: list[str], lineno: int, end: int) -> str:
    """The comments on the assertion's lines and the 4 lines above it."""
    chunk = lines[max(0, lineno - 5) : end]
    return " ".join(x.split("#", 1)[1] for x in chunk if "#" in x)


def timing_findings(text: str, name: str) -> list[str]:
    """What breaks the timing rule in the source ``text`` of file ``name``."""
    tree = ast.parse(text, name)
    lines = text.splitlines()
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Assert):
            continue
        for cmp in (n for n in ast.walk(node.test) if isinstance(n, ast.Compare)):
            for measured, bound in upper_bounds(cmp):
                if not is_clock(measured) or is_clock(bound):
                    continue
                if any("deadline" in x for x in _names(bound)):
                    continue  # how long to wait for an event, not a margin
                where = f"{name}:{node.lineno}"
                note = comment_near(lines, node.lineno, node.end_lineno or node.lineno)
                if not (isinstance(bound, ast.Constant) and bound.value):
                    if "relative" not in note.lower():
                        found.append(
                            f"{where}: a bound that is not a number needs "
                            "a comment saying what it is relative to"
                        )
                    continue
                typical = TYPICAL.search(note)
                if typical is None:
                    found.append(f"{where}: no 'X s here' comment (the typical value)")
                elif float(bound.value) < 5 * float(typical.group(1)):
                    found.append(
                        f"{where}: bound {bound.value} s < 5 x {typical.group(1)} s"
                    )
    for loop in (n for n in ast.walk(tree) if isinstance(n, (ast.While, ast.For))):
        body = ast.Module(body=loop.body, type_ignores=[])
        sleeps = any(
            isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute)
            and n.func.attr == "sleep"
            for n in ast.walk(body)
        )
        gauges = GAUGES & {
            n.attr for n in ast.walk(body) if isinstance(n, ast.Attribute)
        }
        if sleeps and gauges:
            found.append(
                f"{name}:{loop.lineno}: a polling loop reads "
                f"the gauge(s) {sorted(gauges)}: read a counter or an event"
            )
    return found


def test_wall_clock_bounds_are_5x_what_they_measure_and_no_gauge_is_polled():
    """An upper bound on measured time states, in a comment beside it, what it
    measured here ('~0.3 s here') and is at least 5x that (or is relative to
    another measurement of the same run, and says so)."""
    found = [
        f
        for path in TEST_FILES
        for f in timing_findings(path.read_text(), str(path.relative_to(REPO)))
    ]
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    "code,problem",
    [
        ("t0 = time.monotonic()\nassert time.monotonic() - t0 < 1.0\n", "no 'X s"),
        ("assert took < 1.0  # 0.5 s here\n", "< 5 x 0.5"),
        ("assert took < 10  # ~0.5 s here\n", None),
        ("assert wall < total / 4\n", "not a number"),
        ("assert wall < total / 4  # relative to the total\n", None),
        ("assert e['end'] - e['start'] < 2.0\n", "no 'X s"),
        ("assert x < 2.0\n", None),
        ("assert time.monotonic() < deadline, 'never came'\n", None),
        ("while True:\n    m.kv_cache_usage\n    time.sleep(1)\n", "polling loop"),
        ("while True:\n    m.generation_tokens\n    time.sleep(1)\n", None),
    ],
)
def test_the_timing_rule_finds_what_it_should(code, problem):
    found = timing_findings(f"import time\n{code}", "probe.py")
    if problem is None:
        assert found == []
    else:
        assert len(found) == 1 and problem in found[0], found
