"""Grading overhead per sample: python grader (sandboxed; batches of 1 and 32)
against string_check, median of several repeats.

    PYTHONPATH=$PWD python scripts/graders_overhead.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

from areal_marlaas.graders import grade_batch_sync, parse_grader

PY = {
    "type": "python",
    "name": "py",
    "source": "def grade(sample, item):\n"
    "    return float(sample['output_text'].strip() == item['answer'])\n",
}
SC = {
    "type": "string_check",
    "name": "sc",
    "input": "{{ sample.output_text }}",
    "reference": "{{ item.answer }}",
    "operation": "eq",
}


def per_sample_ms(spec: dict, batch: int, repeats: int) -> float:
    grader = parse_grader(spec)
    pairs = [(str(k), {"answer": str(k)}) for k in range(batch)]
    grade_batch_sync(grader, pairs)  # warm up (imports, first sandbox)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        results = grade_batch_sync(grader, pairs)
        times.append((time.perf_counter() - start) / batch * 1000)
        assert all(r.reward == 1.0 for r in results), results[0].reason
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    print(f"{platform.machine()}, {os.cpu_count()} cores, uid {os.getuid()}")
    for label, spec, batch in (
        ("string_check, batch 1", SC, 1),
        ("string_check, batch 32", SC, 32),
        ("python, batch 1", PY, 1),
        ("python, batch 32", PY, 32),
    ):
        ms = per_sample_ms(spec, batch, args.repeats)
        print(f"{label:24s} {ms:8.3f} ms/sample (median of {args.repeats})")


if __name__ == "__main__":
    main()
