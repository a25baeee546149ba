"""``marlaas bench-service``'s runs: for each repeat, each service (async, fifo)
started fresh, each arrival rate; the table, JSON (rewritten after every run, so
a stopped bench keeps what it measured) and the TTFS-by-arrival plot."""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf, open_dict

from areal_marlaas.bench.report import mean_sd
from areal_marlaas.bench.service_load import (
    BASE_MODEL,
    GRADERS,
    TERMINAL,
    TTFS_PARTS,
    ServiceProcess,
    arithmetic_lines,
    arrival_times,
    job_steps,
    run_metrics,
)
from areal_marlaas.config.bench_service import ServiceBenchConfig, ServiceLoadConfig
from areal_marlaas.config.loader import compose_yaml, load_config, parse_args
from areal_marlaas.rollout.server import free_port

logger = logging.getLogger("MARLaaSBenchService")


def load_service_bench(argv: list[str]) -> tuple[ServiceBenchConfig, str, list[str]]:
    """``--config X.yaml [load.k=v ...] [service.k=v ...]`` -> the validated
    config, the service YAML every run starts from (the main YAML without its
    ``load`` section) and the service overrides (every override but ``load.*``)."""
    cfg, config_file = load_config(argv, schema=ServiceBenchConfig)
    args = parse_args(argv)
    overrides = [o for o in args.overrides if not o.lstrip("+").startswith("load.")]
    raw = compose_yaml(config_file)
    with open_dict(raw):
        raw.pop("load", None)
    base = Path(tempfile.mkdtemp(prefix="marlaas-bench-service-")) / "service.yaml"
    OmegaConf.save(raw, base)
    return cfg, str(base), overrides


class ServiceBench:
    def __init__(self, cfg: ServiceBenchConfig, base_yaml: str, overrides: list[str]):
        self.cfg = cfg
        self.load: ServiceLoadConfig = cfg.load
        self.base_yaml = base_yaml
        self.overrides = overrides
        self.out = Path(self.load.out)
        self.work = Path(
            self.load.work_dir
            or Path(cfg.cluster.fileroot) / f"{cfg.experiment_name}-bench"
        )
        self.result: dict[str, Any] = {
            "load": OmegaConf.to_container(OmegaConf.structured(self.load)),
            "overrides": overrides,
            "runs": [],
        }

    # -- one service, every rate ---------------------------------------------------
    def _service_overrides(self, service: str) -> list[str]:
        # One tenant sends every job, so the per-tenant caps decide: fifo runs
        # one at a time, async all of them; both hold every job in the queue.
        n = self.load.jobs
        order = "first_steps" if service == "async_first" else "fifo"
        return [
            *self.overrides,
            f"scheduler.train_order={order}",
            f"service.max_running_jobs={1 if service == 'fifo' else n}",
            f"service.max_queued_jobs={max(n, self.cfg.service.max_queued_jobs)}",
            f"service.max_tasks={max(n, self.cfg.service.max_tasks)}",
        ]

    def _tenant(self, proc: ServiceProcess) -> Any:
        """The tenant (created in the service's store before it starts) as an
        ``openai`` client."""
        import openai

        from areal_marlaas.service.cli import load_service_config
        from areal_marlaas.service.store import JobStore

        cfg = load_service_config(self.base_yaml, proc.overrides).service
        store = JobStore.from_config(cfg)
        try:
            _, key = store.create_tenant("bench")
        finally:
            store.close()
        return openai.OpenAI(base_url=proc.base_url, api_key=key, max_retries=2)

    def _method(self) -> dict[str, Any]:
        hp = {
            "batch_size": self.load.batch_size,
            "n_epochs": self.load.n_epochs,
            "compute_multiplier": self.load.compute_multiplier,
        }
        return {
            "type": "reinforcement",
            "reinforcement": {
                "grader": GRADERS[self.load.grader],
                "hyperparameters": hp,
            },
        }

    def _one_rate(
        self, client: Any, files: list[str], rate: float, seed: int
    ) -> dict[str, Any]:
        """Send the jobs at their arrival times, wait for all, read them back."""
        offsets = arrival_times(self.load.jobs, rate, seed)
        t0 = time.monotonic()
        first_arrival = None
        ids = []
        for file_id, at in zip(files, offsets, strict=True):
            time.sleep(max(0.0, t0 + at - time.monotonic()))
            if first_arrival is None:
                first_arrival = time.time()
            job = client.fine_tuning.jobs.create(
                model=BASE_MODEL, training_file=file_id, method=self._method()
            )
            ids.append(job.id)
        deadline = t0 + self.load.run_timeout_s
        pending = set(range(len(ids)))
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{len(pending)} job(s) not finished after "
                    f"{self.load.run_timeout_s:.0f} s (load.run_timeout_s)"
                )
            for i in list(pending):
                if client.fine_tuning.jobs.retrieve(ids[i]).status in TERMINAL:
                    pending.discard(i)
            time.sleep(1.0)
        jobs = []
        for job_id in ids:
            job = client.fine_tuning.jobs.retrieve(job_id)
            started = getattr(job, "started_at", None)
            jobs.append(
                {
                    "id": job_id,
                    "status": job.status,
                    "ttfs_s": getattr(job, "ttfs_s", None),
                    # The job object's times are whole seconds.
                    "waiting_s": None if started is None else started - job.created_at,
                    **job_steps(client, job_id),
                }
            )
        return {
            "arrivals_s": offsets,
            "jobs": jobs,
            "metrics": run_metrics(jobs, first_arrival),
        }

    def _one_service(self, service: str, repeat: int) -> None:
        root = self.work / f"{service}.r{repeat}"
        shutil.rmtree(root, ignore_errors=True)  # a fresh service: no old jobs
        proc = ServiceProcess(
            root, self.base_yaml, self._service_overrides(service), free_port()
        )
        client = self._tenant(proc)
        t = time.monotonic()
        try:
            proc.start()
            startup = time.monotonic() - t
            files = [
                client.files.create(
                    file=(f"j{i}.jsonl", arithmetic_lines(self.load.lines_per_job, i)),
                    purpose="fine-tune",
                ).id
                for i in range(self.load.jobs)
            ]
            for rate in self.load.rates_per_min:
                label = f"{service}@{rate:g}/min.r{repeat}"
                logger.info("run %s", label)
                print(f"[bench-service] {label}: {self.load.jobs} jobs", flush=True)
                run = {"label": label, "service": service, "rate_per_min": rate}
                run["repeat"] = repeat
                run["startup_s"] = startup
                try:
                    seed = self.load.seed + repeat
                    run.update(self._one_rate(client, files, rate, seed))
                    run["status"] = "ok"
                    m = run["metrics"]
                    if m["succeeded"] != m["jobs"]:
                        run["status"] = "failed"
                        run["error"] = f"{m['jobs'] - m['succeeded']} job(s) failed"
                except Exception as e:  # noqa: BLE001 - recorded, the bench goes on
                    run["status"] = "failed"
                    run["error"] = f"{type(e).__name__}: {e}\n{proc.tail(20)}"
                self.result["runs"].append(run)
                self._write()
                print(format_run(run), flush=True)
                if not proc.alive():
                    break
        finally:
            proc.stop()

    def run(self) -> dict[str, Any]:
        self.out.mkdir(parents=True, exist_ok=True)
        for repeat in range(self.load.repeats):
            for service in self.load.services:
                self._one_service(service, repeat)
        self._write()
        return self.result

    def _write(self) -> None:
        self.result["summary"] = summarize(self.result)
        (self.out / "bench_service.json").write_text(
            json.dumps(self.result, indent=1, default=str)
        )
        (self.out / "bench_service.md").write_text(format_markdown(self.result))
        if any(r["status"] == "ok" for r in self.result["runs"]):
            plot_ttfs(self.result, self.out / "ttfs_by_arrival.png")


# -- report ------------------------------------------------------------------------
KEYS = (
    "ttfs_p50_s",
    "ttfs_p95_s",
    "tpts_p50_s",
    "tpts_p95_s",
    "steps_per_hour",
    "step_s",
    "ttfs_p95_in_steps",
    "ttfs_p95_in_tpts",
    "window_s",
)


def summarize(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (service, rate): its successful repeats, mean and sd per
    metric; plus async / fifo ratios per rate."""
    groups: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for r in result["runs"]:
        groups.setdefault((r["service"], r["rate_per_min"]), []).append(r)
    rows = []
    for (service, rate), runs in groups.items():
        ok = [r for r in runs if r["status"] == "ok"]
        row: dict[str, Any] = {
            "service": service,
            "rate_per_min": rate,
            "repeats": len(ok),
            "failed": len(runs) - len(ok),
        }
        for k in KEYS:
            row[k] = mean_sd([r["metrics"][k] for r in ok])
        parts = [r["metrics"].get("ttfs_parts") for r in ok]
        parts = [x for x in parts if x]
        row["ttfs_parts"] = (
            {k: mean_sd([x[k] for x in parts]) for k in TTFS_PARTS} if parts else None
        )
        rows.append(row)
    by = {(r["service"], r["rate_per_min"]): r for r in rows}
    for row in rows:
        fifo = by.get(("fifo", row["rate_per_min"]))
        if row["service"] != "fifo" and fifo and fifo["repeats"]:
            a, f = row["steps_per_hour"][0], fifo["steps_per_hour"][0]
            row["throughput_vs_fifo"] = a / f if a and f else None
            a, f = row["ttfs_p95_s"][0], fifo["ttfs_p95_s"][0]
            row["ttfs_p95_vs_fifo"] = a / f if a and f else None
    return rows


def _ms(v: tuple[float | None, float | None], digits: int = 1) -> str:
    mean, sd = v
    if mean is None:
        return "-"
    return f"{mean:.{digits}f}" + (f" +- {sd:.{digits}f}" if sd is not None else "")


def format_markdown(result: dict[str, Any]) -> str:
    lines = [
        "| service | jobs/min | repeats | TTFS p50 s | TTFS p95 s | TPTS p50 s | "
        "TPTS p95 s | steps/h | step s | TTFS p95 / step | TTFS p95 / TPTS p50 |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result.get("summary") or summarize(result):
        lines.append(
            f"| {r['service']} | {r['rate_per_min']:g} | {r['repeats']}"
            + (f" ({r['failed']} failed)" if r["failed"] else "")
            + " | "
            + " | ".join(
                _ms(r[k], 2 if k.endswith(("in_steps", "in_tpts")) else 1)
                for k in KEYS
                if k != "window_s"
            )
            + " |"
        )
    ratios = [
        f"at {r['rate_per_min']:g} jobs/min: {r['service']}/fifo steps/h "
        f"{r['throughput_vs_fifo']:.2f}x, TTFS p95 {r['ttfs_p95_vs_fifo']:.2f}x"
        for r in result.get("summary") or []
        if r.get("throughput_vs_fifo") and r.get("ttfs_p95_vs_fifo")
    ]
    if ratios:
        lines += ["", "; ".join(ratios)]
    parted = [r for r in result.get("summary") or [] if r.get("ttfs_parts")]
    if parted:
        lines += [
            "",
            "Where TTFS went (mean per job, s): waiting = in the service's job "
            "queue; first batch = set-up, rollout and rewards; queue = in the "
            "training queue; train = the step.",
            "",
            "| service | jobs/min | waiting | first batch | queue | train |",
            "|---|---|---|---|---|---|",
        ]
        for r in parted:
            lines.append(
                f"| {r['service']} | {r['rate_per_min']:g} | "
                + " | ".join(_ms(r["ttfs_parts"][k]) for k in TTFS_PARTS)
                + " |"
            )
    return "\n".join(lines) + "\n"


def format_run(run: dict[str, Any]) -> str:
    if run["status"] != "ok":
        return f"{run['label']}: {run['status']}: {run.get('error', '')[:300]}"
    m = run["metrics"]

    def f(x):
        return "-" if x is None else f"{x:.1f}"

    return (
        f"{run['label']}: {m['succeeded']}/{m['jobs']} jobs, {m['steps']} steps in "
        f"{f(m['window_s'])} s ({f(m['steps_per_hour'])} steps/h); TTFS p50 "
        f"{f(m['ttfs_p50_s'])} p95 {f(m['ttfs_p95_s'])} s; TPTS p50 "
        f"{f(m['tpts_p50_s'])} s; step {f(m['step_s'])} s"
    )


def plot_ttfs(result: dict[str, Any], path: Path) -> None:
    """TTFS against arrival order, one line per (service, rate), mean over
    repeats: FIFO's grows with the queue ahead, async's should not."""
    from areal_marlaas.bench.plots import _plt

    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    groups: dict[tuple[str, float], list[list[float]]] = {}
    for r in result["runs"]:
        if r["status"] == "ok":
            key = (r["service"], r["rate_per_min"])
            groups.setdefault(key, []).append(r["metrics"]["ttfs_by_arrival"])
    for (service, rate), rows in sorted(groups.items()):
        n = min(len(x) for x in rows)
        ys = [sum(x[i] for x in rows) / len(rows) for i in range(n)]
        ax.plot(
            range(1, n + 1),
            ys,
            marker="o",
            linestyle="-" if service == "async" else "--",
            label=f"{service}, {rate:g} jobs/min",
        )
    ax.set_xlabel("job (arrival order)")
    ax.set_ylabel("TTFS s (mean over repeats)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
