"""RL tenants alone vs the same RL tenants with supervised tenants beside them,
through ``marlaas train`` (one trainer, one train queue, ``train_order=fair``
with equal weights), over repeats.

Arm ``rl``: two GRPO tasks (1-digit addition and multiplication, held-out
problems by construction: ``holdout 0.2``), evaluated on their held-out rows
after their last step. Arm ``rl+sft``: the same two tasks, same seeds, plus two
SFT tasks (the echo task, ``bench/echo_task.py``). Per run, from the run
directory: the RL tasks' steps/h (their commits over the run's training window)
and final held-out reward, the SFT tasks' steps/h, and the trainer's busy share
(train-phase time over the window). Prints a table and writes
``<out>/methods_mix.json``, ``.md`` and ``.png``.

    python scripts/bench_methods_mix.py --repeats 3 --rl-steps 4 --sft-steps 8
        --out runs/methods_mix
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from areal_marlaas.bench.echo_task import write_echo_data
from areal_marlaas.bench.fairness import union
from areal_marlaas.bench.train_cli import run_train, write_result
from areal_marlaas.rundir.reader import phase_records, read_jsonl

RL = ("add1", "mul1")
SFT = ("echo_a", "echo_b")


def rl_task(name: str, kind: str, seed: int, steps: int) -> dict:
    return {
        "name": name,
        "kind": kind,
        "dataset": {"digits": 1, "size": 4000, "split": "train", "holdout": 0.2},
        "eval_dataset": {"digits": 1, "split": "test", "holdout": 0.2, "size": 256},
        "eval_interval": steps,
        "eval_samples": 32,
        "batch_size": 4,
        "n_samples": 4,
        "max_new_tokens": 40,
        "max_prompt_tokens": 128,
        "temperature": 0.7,
        "lr": 3.0e-4,
        "total_steps": steps,
        "seed": seed,
    }


def tasks(arm: str, repeat: int, args, data: Path) -> list[dict]:
    out = [
        rl_task("add1", "addition", 31 + 10 * repeat, args.rl_steps),
        rl_task("mul1", "multiplication", 32 + 10 * repeat, args.rl_steps),
    ]
    if arm == "rl+sft":
        for i, name in enumerate(SFT):
            echo = write_echo_data(data / name, 64, 8, 1, seed=100 * repeat + i)
            out.append(
                {
                    "name": name,
                    "method": "sft",
                    "dataset": {"path": str(echo["train"])},
                    "batch_size": 8,
                    "total_steps": args.sft_steps,
                    "lr": 1.0e-3,
                    "seed": 40 + i,
                }
            )
    return out


def measure(run_dir: Path) -> dict:
    steps = read_jsonl(run_dir / "steps.jsonl")
    phases = phase_records(read_jsonl(run_dir / "events.jsonl"))
    train = [(p["start"], p["end"]) for p in phases if p["phase"] == "train"]
    lo = min(p["start"] for p in phases)
    hi = max(s["t_commit"] for s in steps)
    window = hi - lo
    busy = sum(b - a for a, b in union(train)) / window

    def per_h(names):
        return sum(1 for s in steps if s["task"] in names) / window * 3600

    evals = {
        e["task"]: e["reward_mean"]
        for e in read_jsonl(run_dir / "evals.jsonl")
        if e["task"] in RL
    }
    return {
        "window_s": round(window, 1),
        "rl_steps_per_h": per_h(RL),
        "sft_steps_per_h": per_h(SFT),
        "trainer_busy": busy,
        "rl_heldout_reward": statistics.fmean(evals[t] for t in RL),
        "heldout": evals,
    }


def run_arm(arm: str, repeat: int, args, out: Path) -> dict:
    here = out / f"{arm.replace('+', '_')}.r{repeat}"
    t0 = time.monotonic()
    run_dir = run_train(
        tasks(arm, repeat, args, here),
        here,
        out / "runs",
        ["scheduler.train_order=fair"],
    )
    row = {"arm": arm, "repeat": repeat, "wall_s": round(time.monotonic() - t0, 1)}
    return row | measure(run_dir)


def mean_sd(values: list[float]) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.3f} ± {sd:.3f}"


def markdown(rows: list[dict]) -> str:
    keys = ("rl_steps_per_h", "rl_heldout_reward", "sft_steps_per_h", "trainer_busy")
    lines = [
        "| arm | runs | " + " | ".join(keys) + " |",
        "|---|---|" + "---|" * len(keys),
    ]
    for arm in ("rl", "rl+sft"):
        mine = [r for r in rows if r["arm"] == arm]
        cells = [mean_sd([r[k] for r in mine]) for k in keys]
        lines.append(f"| {arm} | {len(mine)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = ("rl_steps_per_h", "sft_steps_per_h", "trainer_busy", "rl_heldout_reward")
    fig, axes = plt.subplots(1, len(keys), figsize=(3.2 * len(keys), 3))
    for ax, key in zip(axes, keys, strict=True):
        for i, arm in enumerate(("rl", "rl+sft")):
            vals = [r[key] for r in rows if r["arm"] == arm]
            ax.bar(i, statistics.fmean(vals), color=f"C{i}", alpha=0.6)
            ax.scatter([i] * len(vals), vals, color="k", s=10)
        ax.set_xticks([0, 1], ["rl", "rl+sft"])
        ax.set_title(key, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--out", default="runs/methods_mix")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rl-steps", type=int, default=4)
    p.add_argument("--sft-steps", type=int, default=8)
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for repeat in range(args.repeats):  # arms interleaved: drift hits both
        for arm in ("rl", "rl+sft"):
            rows.append(run_arm(arm, repeat, args, out))
            print(json.dumps(rows[-1]), flush=True)
    text = markdown(rows)
    write_result(out, "methods_mix", {"runs": rows}, text)
    plot(rows, out / "methods_mix.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
