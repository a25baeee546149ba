"""The machine a measurement comes from: an absolute figure means little without
its cores, CPU flags and the matrix-multiply rate measured in the same run."""

from __future__ import annotations

import os
import platform
import time
from typing import Any

# Flags that decide CPU matmul speed (bf16 is emulated without the last ones).
FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def cpu_facts() -> dict[str, Any]:
    model, flags = "", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and not model:
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return {
        "cpu": model or platform.processor(),
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)),
        "flags": [f for f in FLAGS if f in flags],
        "memory_gib": round(
            os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1
        ),
    }


def gemm_gflops(threads: int = 1, m: int = 1320, k: int = 576, n: int = 1536) -> float:
    """fp32 GEMM rate of this machine with ``threads`` threads (the trainer's
    typical shape: 1,320 tokens x hidden 576 x 1,536), best of 5 after warm-up."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, b = torch.randn(m, k), torch.randn(k, n)
        for _ in range(3):
            _ = a @ b
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(10):
                _ = a @ b
            best = min(best, (time.perf_counter() - t0) / 10)
        return 2 * m * k * n / best / 1e9
    finally:
        torch.set_num_threads(old)


def machine() -> dict[str, Any]:
    facts = cpu_facts()
    facts["fp32_gemm_gflops_1thread"] = round(gemm_gflops(1), 1)
    facts["fp32_gemm_gflops_all"] = round(gemm_gflops(facts["cores_usable"]), 1)
    return facts


def describe(m: dict[str, Any]) -> str:
    return (
        f"{m['cpu']}, {m['cores_usable']} of {m['cores']} cores, flags "
        f"{' '.join(m['flags']) or 'none of ' + '/'.join(FLAGS)}, "
        f"{m['memory_gib']} GiB; fp32 GEMM 1320x576x1536: "
        f"{m['fp32_gemm_gflops_1thread']} GFLOP/s on 1 thread, "
        f"{m['fp32_gemm_gflops_all']} on {m['cores_usable']}"
    )
