"""Held-out learning of a tool task: a lookup whose answer only the tool knows,
alone and among single-turn tenants (``marlaas bench-learning``).

The task: "What is the secret code of <key>?" where <key> is a made-up word and
its 4-digit code lives only in a corpus that ``marlaas search-server`` serves as
a ``search`` tool in OpenAI's Agent RFT protocol (``/tools/search``). Each row
carries two few-shot demonstrations (demo keys of their own) and the tool's
function schema; the grader checks that the answer contains the code. Held out
by construction: the demo, training and eval keys are disjoint slices of one
shuffled pool of distinct words.

This script writes the data (corpus, train, eval), starts the search server
(``--latency-median-s`` injects a tool latency) and runs

    marlaas bench-learning --config configs/learning.yaml
        tasks_file=tasks/learning_tools.yaml <--seeds/--steps/...>

with ``LOOKUP_DATA`` and ``LOOKUP_URL`` set for that tasks file.

    python scripts/bench_tool_learning.py --seeds 1,2,3 --steps 3 --eval-every 3
        --eval-prompts 40 --out runs/learning_tools [--latency-median-s 0]
        [other bench-learning arguments]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from areal_marlaas.bench.lookup_task import write_lookup_task
from areal_marlaas.tools.local_search import LocalSearchServer, LocalSearchSpec

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--out", default="runs/learning_tools")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--eval-every", type=int, default=3)
    p.add_argument("--eval-prompts", type=int, default=40)
    p.add_argument("--train-keys", type=int, default=400)
    p.add_argument("--eval-keys", type=int, default=64)
    p.add_argument("--data-seed", type=int, default=0)
    p.add_argument("--latency-median-s", type=float, default=0.0)
    # Anything else (overrides, --base-only, ...) goes to bench-learning as is.
    args, rest = p.parse_known_args()
    out = Path(args.out)
    data = out / "data"
    sizes = write_lookup_task(data, args.train_keys, args.eval_keys, args.data_seed)
    print(f"lookup task: {sizes} keys in {data}", flush=True)
    server = LocalSearchServer(
        LocalSearchSpec(
            str(data / "corpus.jsonl"),
            workers=1,
            latency_median_s=args.latency_median_s,
        ),
        log_file=out / "search_server.log",
    )
    url = server.start()
    env = {
        **os.environ,
        "LOOKUP_DATA": str(data.resolve()),
        "LOOKUP_URL": f"{url}/tools/search",
    }
    cmd = [
        sys.executable,
        "-m",
        "areal_marlaas.cli",
        "bench-learning",
        "--config",
        str(ROOT / "configs" / "learning.yaml"),
        "tasks_file=tasks/learning_tools.yaml",
        *rest,
        "--seeds",
        args.seeds,
        "--steps",
        str(args.steps),
        "--eval-every",
        str(args.eval_every),
        "--eval-prompts",
        str(args.eval_prompts),
        "--out",
        str(out),
    ]
    try:
        return subprocess.call(cmd, env=env)
    finally:
        server.stop()


if __name__ == "__main__":
    raise SystemExit(main())
