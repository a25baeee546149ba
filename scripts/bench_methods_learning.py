"""Held-out learning of SFT and DPO tasks through ``marlaas train``, per seed.

Each seed writes the echo task (``areal_marlaas/bench/echo_task.py``: "Say <word>
three times, separated by commas." for made-up words) as demonstrations and as
preference pairs (the demonstration preferred over the base model's own greedy
answer, as on-policy preference data is made), with train, validation and test
words disjoint by construction; runs ``marlaas train`` with one SFT and one
DPO task on them (the user's path: the shared trainer, a rollout server that
neither uses); then
scores the base model and each final adapter on the test rows with a plain
Hugging Face forward of the adapter in stock PEFT (``bench/methods_learning``):
SFT's held-out loss and greedy exact match, DPO's held-out preference accuracy.
Prints a table and writes ``<out>/methods_learning.json`` and ``.md``.

    python scripts/bench_methods_learning.py --seeds 1,2,3 --steps 8
        --out runs/methods_learning
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from areal_marlaas.bench.echo_task import prompt, write_echo_data
from areal_marlaas.bench.methods_learning import (
    greedy,
    interval,
    load_model,
    preference_accuracy,
    sft_scores,
)
from areal_marlaas.bench.train_cli import run_train, write_result
from areal_marlaas.paths import default_model_path


def tasks(data: dict, pref: dict, args, seed: int) -> list[dict]:
    common = {"batch_size": args.batch_size, "total_steps": args.steps, "lr": args.lr}
    return [
        {
            "name": "echo_sft",
            "method": "sft",
            "dataset": {"path": str(data["train"])},
            "eval_dataset": {"path": str(data["valid"])},
            "seed": 10 * seed,
            **common,
        },
        {
            "name": "echo_dpo",
            "method": "dpo",
            "beta": args.beta,
            "dataset": {"path": str(pref["train"])},
            "eval_dataset": {"path": str(pref["valid"])},
            "seed": 10 * seed + 1,
            **common,
        },
    ]


def run_seed(seed: int, args, out: Path, base, tok) -> dict:
    here = out / f"seed{seed}"
    data = write_echo_data(here / "sft", args.train, args.valid, args.test, seed)
    # The rejected answers are the base model's own (on-policy pairs).
    own = lambda w: greedy(base, tok, [{"role": "user", "content": prompt(w)}])  # noqa: E731
    pref = write_echo_data(
        here / "dpo",
        args.train,
        args.valid,
        args.test,
        1000 + seed,
        preference=True,
        rejected=own,
    )
    t0 = time.monotonic()
    run_dir = run_train(tasks(data, pref, args, seed), here, out / "runs")
    wall = time.monotonic() - t0
    return {"seed": seed, "run_dir": run_dir, "data": data, "pref": pref, "wall": wall}


def score(run: dict, args, base, tok) -> dict:
    base_path = default_model_path()
    read = lambda p: [json.loads(x) for x in Path(p).read_text().splitlines()]  # noqa: E731
    test, pairs = read(run["data"]["test"]), read(run["pref"]["test"])
    adapters = run["run_dir"] / "tasks"
    out = {
        "seed": run["seed"],
        "train_wall_s": round(run["wall"], 1),
        "base": {
            **sft_scores(base, tok, test),
            "pref_acc": preference_accuracy(base, tok, pairs),
        },
    }
    sft = load_model(base_path, adapters / "echo_sft" / "adapters" / f"v{args.steps}")
    dpo = load_model(base_path, adapters / "echo_dpo" / "adapters" / f"v{args.steps}")
    out["sft"] = sft_scores(sft, tok, test)
    out["dpo"] = {"pref_acc": preference_accuracy(dpo, tok, pairs)}
    return out


def summarize(rows: list[dict]) -> dict:
    gains = {
        "sft_loss_drop": [r["base"]["loss"] - r["sft"]["loss"] for r in rows],
        "sft_exact_match_gain": [
            r["sft"]["exact_match"] - r["base"]["exact_match"] for r in rows
        ],
        "dpo_pref_acc_gain": [
            r["dpo"]["pref_acc"] - r["base"]["pref_acc"] for r in rows
        ],
    }
    return {k: interval(v) for k, v in gains.items()}


def markdown(rows: list[dict], summary: dict) -> str:
    lines = [
        "| seed | base loss | SFT loss | base exact | SFT exact | base pref acc | "
        "DPO pref acc | train wall s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        b = r["base"]
        lines.append(
            f"| {r['seed']} | {b['loss']:.3f} | {r['sft']['loss']:.3f} | "
            f"{b['exact_match']:.3f} | {r['sft']['exact_match']:.3f} | "
            f"{b['pref_acc']:.3f} | {r['dpo']['pref_acc']:.3f} | {r['train_wall_s']} |"
        )
    lines += [
        "",
        "| gain (SFT/DPO - base) | mean ± sd | 95% interval |",
        "|---|---|---|",
    ]
    for k, s in summary.items():
        spread = f"{s['mean']:.3f} ± {s['sd']:.3f}"
        lines.append(f"| {k} | {spread} | [{s['lo']:.3f}, {s['hi']:.3f}] |")
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--out", default="runs/methods_learning")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--beta", type=float, default=0.1)
    p.add_argument("--train", type=int, default=64)
    p.add_argument("--valid", type=int, default=16)
    p.add_argument("--test", type=int, default=32)
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import torch

    torch.set_num_threads(min(2, os.cpu_count() or 1))
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(default_model_path())
    base = load_model(default_model_path())
    rows = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        run = run_seed(seed, args, out, base, tok)
        rows.append(score(run, args, base, tok))
        print(json.dumps(rows[-1]), flush=True)
    summary = summarize(rows)
    text = markdown(rows, summary)
    write_result(out, "methods_learning", {"seeds": rows, "summary": summary}, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
