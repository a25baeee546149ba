"""``marlaas bench-service``'s runs: for each repeat, each service (async, fifo)
started fresh, each arrival rate; the table, JSON (rewritten after every run, so
a stopped bench keeps what it measured) and the TTFS-by-arrival plot."""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf, open_dict

from areal_marlaas.bench.report import mean_sd
from areal_marlaas.bench.service_agents import (
    AGENT_OVERRIDES,
    TOOL_KEYS,
    ToolServers,
    format_tool_table,
)
from areal_marlaas.bench.service_load import (
    BASE_MODEL,
    GRADERS,
    TERMINAL,
    TTFS_PARTS,
    JobPlan,
    ServiceProcess,
    arithmetic_lines,
    arrival_times,
    job_plan,
    job_steps,
    run_metrics,
    tenant_metrics,
)
from areal_marlaas.bench.tool_overlap import tool_overlap
from areal_marlaas.config.bench_service import ServiceBenchConfig, ServiceLoadConfig
from areal_marlaas.config.loader import compose_yaml, load_config, parse_args
from areal_marlaas.rollout.server import free_port
from areal_marlaas.rundir.reader import phase_records, read_jsonl
from areal_marlaas.sim.fit_input import FIT_INPUT
from areal_marlaas.sim.service import dump_service_fit, service_fit_run

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
        # label -> what the simulator fits and replays of a run (fit_input.json).
        self.fit_runs: dict[str, dict[str, Any]] = {}
        self.tools = ToolServers(self.work, [], 1, self.load.seed)  # run() starts them

    # -- one service, every rate ---------------------------------------------------
    def _service_overrides(self, service: str) -> list[str]:
        # The per-tenant caps decide: fifo runs one job at a time (with several
        # tenants, the scheduler holds one), the others every job; all of them
        # hold every job in the queue.
        plan = job_plan(self.load, self.load.seed)
        total = len(plan)
        per_tenant = max(Counter(p.tenant for p in plan).values())
        order = {
            "async_first": "first_steps",
            "fair": "fair",
            "fair_adaptive": "fair",
        }.get(service, "fifo")
        fair = order == "fair"
        adaptive = "adaptive" if service == "fair_adaptive" else "off"
        svc = self.cfg.service
        held = 1 if service == "fifo" and self.load.tenants else total
        agents = AGENT_OVERRIDES if any(p.tool_latency_s for p in plan) else ()
        return [
            *agents,
            *self.overrides,
            f"scheduler.train_order={order}",
            f"scheduler.rollout_order={'fair' if fair else 'fifo'}",
            f"scheduler.concurrency={adaptive}",
            f"service.max_running_jobs={1 if service == 'fifo' else per_tenant}",
            f"service.max_queued_jobs={max(per_tenant, svc.max_queued_jobs)}",
            f"service.max_tasks={held if held == 1 else max(total, svc.max_tasks)}",
        ]

    def _service_config(self, proc: ServiceProcess) -> Any:
        from areal_marlaas.service.cli import load_service_config
        from areal_marlaas.service.runner import stack_config

        return stack_config(load_service_config(self.base_yaml, proc.overrides))

    def _tenants(self, proc: ServiceProcess) -> dict[str, Any]:
        """Every tenant of the load (created with its weight in the service's
        store before it starts), each as an ``openai`` client."""
        import openai

        from areal_marlaas.service.store import JobStore

        store = JobStore.from_config(self._service_config(proc).service)
        clients = {}
        try:
            for name, weight in self._weights().items():
                _, key = store.create_tenant(name, weight=weight)
                clients[name] = openai.OpenAI(
                    base_url=proc.base_url, api_key=key, max_retries=2
                )
        finally:
            store.close()
        return clients

    def _weights(self) -> dict[str, float]:
        return {p.tenant: p.weight for p in job_plan(self.load, self.load.seed)}

    def _task_names(self, proc: ServiceProcess, ids: list[str]) -> list[str]:
        from areal_marlaas.service.store import JobStore

        store = JobStore.from_config(self._service_config(proc).service)
        try:
            return [store.job(i).task_name for i in ids]
        finally:
            store.close()

    def _method(self, job: JobPlan) -> dict[str, Any]:
        hp = {
            "batch_size": job.batch_size,
            "n_epochs": self.load.n_epochs,
            "compute_multiplier": job.compute_multiplier,
        }
        if job.tool_latency_s:
            return {
                "type": "reinforcement",
                "reinforcement": self.tools.reinforcement(job.tool_latency_s, hp),
            }
        return {
            "type": "reinforcement",
            "reinforcement": {
                "grader": GRADERS[self.load.grader],
                "hyperparameters": hp,
            },
        }

    def _one_rate(
        self,
        proc: ServiceProcess,
        clients: dict[str, Any],
        files: list[str],
        rate: float,
        seed: int,
    ) -> dict[str, Any]:
        """Send the jobs at their arrival times, wait for all, read them back."""
        plan = job_plan(self.load, seed)
        offsets = arrival_times(len(plan), rate, seed)
        t0 = time.monotonic()
        first_arrival = None
        ids = []
        for job, file_id, at in zip(plan, files, offsets, strict=True):
            time.sleep(max(0.0, t0 + at - time.monotonic()))
            if first_arrival is None:
                first_arrival = time.time()
            made = clients[job.tenant].fine_tuning.jobs.create(
                model=BASE_MODEL, training_file=file_id, method=self._method(job)
            )
            ids.append(made.id)
        deadline = t0 + self.load.run_timeout_s
        pending = set(range(len(ids)))
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{len(pending)} job(s) not finished after "
                    f"{self.load.run_timeout_s:.0f} s (load.run_timeout_s)"
                )
            for i in list(pending):
                client = clients[plan[i].tenant]
                if client.fine_tuning.jobs.retrieve(ids[i]).status in TERMINAL:
                    pending.discard(i)
            time.sleep(1.0)
        jobs = []
        tasks = self._task_names(proc, ids)
        for job, job_id, task in zip(plan, ids, tasks, strict=True):
            client = clients[job.tenant]
            got = client.fine_tuning.jobs.retrieve(job_id)
            started = getattr(got, "started_at", None)
            jobs.append(
                {
                    "id": job_id,
                    "tenant": job.tenant,
                    "task": task,
                    "status": got.status,
                    "ttfs_s": getattr(got, "ttfs_s", None),
                    # The job object's times are whole seconds.
                    "waiting_s": None if started is None else started - got.created_at,
                    "usage": getattr(got, "usage", None),
                    **job_steps(client, job_id),
                }
            )
        metrics = run_metrics(jobs, first_arrival)
        run_dir = self._service_config(proc).run_dir
        events = read_jsonl(run_dir / "events.jsonl")
        if self.load.tenants:
            metrics.update(tenant_metrics(jobs, phase_records(events), self._weights()))
        commits = [c for j in jobs for c in j["commits"]]
        window = (first_arrival, max(commits)) if commits and first_arrival else None
        metrics.update(tool_overlap(phase_records(events), window))
        fit = service_fit_run(
            events, read_jsonl(run_dir / "steps.jsonl"), jobs, offsets, first_arrival
        )
        return {"arrivals_s": offsets, "jobs": jobs, "metrics": metrics, "fit": fit}

    def _lines(self, job: JobPlan, i: int) -> bytes:
        if job.tool_latency_s:
            return self.tools.lines(job.lines)
        return arithmetic_lines(job.lines, i)

    def _one_service(self, service: str, repeat: int) -> None:
        root = self.work / f"{service}.r{repeat}"
        shutil.rmtree(root, ignore_errors=True)  # a fresh service: no old jobs
        proc = ServiceProcess(
            root, self.base_yaml, self._service_overrides(service), free_port()
        )
        clients = self._tenants(proc)
        seed = self.load.seed + repeat
        t = time.monotonic()
        try:
            proc.start()
            startup = time.monotonic() - t
            files = [  # each job's file, uploaded by the tenant that sends it
                clients[job.tenant]
                .files.create(
                    file=(f"j{i}.jsonl", self._lines(job, i)),
                    purpose="fine-tune",
                )
                .id
                for i, job in enumerate(job_plan(self.load, seed))
            ]
            for rate in self.load.rates_per_min:
                label = f"{service}@{rate:g}/min.r{repeat}"
                logger.info("run %s", label)
                print(f"[bench-service] {label}: {len(files)} jobs", flush=True)
                run = {"label": label, "service": service, "rate_per_min": rate}
                run["repeat"] = repeat
                run["startup_s"] = startup
                try:
                    measured = self._one_rate(proc, clients, files, rate, seed)
                    self.fit_runs[label] = measured.pop("fit")
                    run.update(measured)
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
        plans = [
            job_plan(self.load, self.load.seed + r) for r in range(self.load.repeats)
        ]
        agent_rows = max(sum(j.lines for j in p if j.tool_latency_s) for p in plans)
        latencies = [j.tool_latency_s for j in plans[0]]
        with ToolServers(self.work, latencies, max(agent_rows, 1), self.load.seed) as t:
            self.tools = t
            for repeat in range(self.load.repeats):
                for service in self.load.services:
                    # Every service sees the same agent rows.
                    t.next = 0
                    self._one_service(service, repeat)
        self._write()
        return self.result

    def _write(self) -> None:
        self.result["summary"] = summarize(self.result)
        (self.out / "bench_service.json").write_text(
            json.dumps(self.result, indent=1, default=str)
        )
        (self.out / "bench_service.md").write_text(format_markdown(self.result))
        if self.fit_runs:
            (self.out / FIT_INPUT).write_text(dump_service_fit(self.fit_runs))
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
    "jct_p50_s",
    "jct_p95_s",
    "window_s",
    *TOOL_KEYS,
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
            row[k] = mean_sd([r["metrics"].get(k) for r in ok])
        parts = [r["metrics"].get("ttfs_parts") for r in ok]
        parts = [x for x in parts if x]
        row["ttfs_parts"] = (
            {k: mean_sd([x[k] for x in parts]) for k in TTFS_PARTS} if parts else None
        )
        row.update(summarize_tenants([r["metrics"] for r in ok]))
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


TENANT_KEYS = (
    "ttfs_p95_s",
    "ttfs_p95_in_steps",
    "step_s",
    "weighted_trainer_share",
    "token_share",
)
FAIRNESS_KEYS = ("jain", "max_min_ratio", "window_s")


def summarize_tenants(metrics: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean and sd over repeats of each tenant's metrics and of the trainer's
    fairness (runs with ``load.tenants``; else nothing)."""
    metrics = [m for m in metrics if m.get("tenants")]
    if not metrics:
        return {}
    names = sorted({t for m in metrics for t in m["tenants"]})
    return {
        "tenants": {
            t: {
                k: mean_sd([m["tenants"][t][k] for m in metrics if t in m["tenants"]])
                for k in TENANT_KEYS
            }
            for t in names
        },
        "fairness": {
            k: mean_sd([m["fairness"][k] for m in metrics]) for k in FAIRNESS_KEYS
        },
    }


def _ms(v: tuple[float | None, float | None], digits: int = 1) -> str:
    mean, sd = v
    if mean is None:
        return "-"
    return f"{mean:.{digits}f}" + (f" +- {sd:.{digits}f}" if sd is not None else "")


def format_markdown(result: dict[str, Any]) -> str:
    lines = [
        "| service | jobs/min | repeats | TTFS p50 s | TTFS p95 s | TPTS p50 s | "
        "TPTS p95 s | steps/h | step s | TTFS p95 / step | TTFS p95 / TPTS p50 | "
        "job done p50 s | job done p95 s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result.get("summary") or summarize(result):
        lines.append(
            f"| {r['service']} | {r['rate_per_min']:g} | {r['repeats']}"
            + (f" ({r['failed']} failed)" if r["failed"] else "")
            + " | "
            + " | ".join(
                _ms(r[k], 2 if k.endswith(("in_steps", "in_tpts")) else 1)
                for k in KEYS
                if k != "window_s" and k not in TOOL_KEYS
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
    lines += format_tool_table(result.get("summary") or [], _ms)
    shared = [r for r in result.get("summary") or [] if r.get("tenants")]
    if shared:
        lines += [
            "",
            "Tenants: TTFS p95 in its own steps; weighted trainer share = its "
            "trainer-seconds / weight over all tenants'; Jain and max/min of the "
            "weighted trainer-seconds while every tenant was backlogged.",
            "",
            "| service | jobs/min | tenant | TTFS p95 s | TTFS p95 / own step | "
            "step s | weighted trainer share | token share |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in shared:
            for t, m in r["tenants"].items():
                lines.append(
                    f"| {r['service']} | {r['rate_per_min']:g} | {t} | "
                    + " | ".join(
                        _ms(m[k], 1 if k.endswith("_s") else 2) for k in TENANT_KEYS
                    )
                    + " |"
                )
        lines += [
            "",
            "| service | jobs/min | Jain | max/min | all-backlogged window s |",
            "|---|---|---|---|---|",
        ]
        for r in shared:
            f = r["fairness"]
            lines.append(
                f"| {r['service']} | {r['rate_per_min']:g} | {_ms(f['jain'], 3)} | "
                f"{_ms(f['max_min_ratio'], 2)} | {_ms(f['window_s'])} |"
            )
    parted = [r for r in result.get("summary") or [] if r.get("ttfs_parts")]
    if parted:
        lines += [
            "",
            "Where TTFS went (mean per job, s): waiting = until its first "
            "rollout (job queue, hand-over with its set-up, admission); first "
            "batch = rollout and rewards; queue = in the training queue; train "
            "= the step.",
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

    tools = (
        f"; tools {f(m['tool_s'])} s, {m['tool_hidden_share']:.0%} hidden"
        if m.get("tool_s")
        else ""
    )
    return (
        f"{run['label']}: {m['succeeded']}/{m['jobs']} jobs, {m['steps']} steps in "
        f"{f(m['window_s'])} s ({f(m['steps_per_hour'])} steps/h); TTFS p50 "
        f"{f(m['ttfs_p50_s'])} p95 {f(m['ttfs_p95_s'])} s; TPTS p50 "
        f"{f(m['tpts_p50_s'])} s; step {f(m['step_s'])} s{tools}"
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
