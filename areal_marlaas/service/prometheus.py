"""Prometheus metrics of the service, on a registry of its own (not the process
global one, which AReaL and vLLM clients may also fill).

Jobs per tenant and status, the queue length and each tenant's usage are read
from the job store at scrape time. The scheduler side reports the rest through
:class:`ServiceMetrics`:
``observe_ttfs``, ``observe_step``, ``observe_tools``, ``set_trainer_busy``,
``set_kv_usage``.
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from areal_marlaas.service.store import JobStore
from areal_marlaas.service.tables import QUEUED, STATUSES

# Seconds; TTFS spans queueing, so it reaches hours on a busy pool.
TTFS_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, float("inf"))
STEP_BUCKETS = (0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, float("inf"))
TOOL_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 600, float("inf"))


# Per-tenant usage, summed over its jobs from the job store at scrape time.
USAGE = (
    ("trainer_s", "marlaas_tenant_trainer_seconds", "Trainer-seconds of its steps."),
    (
        "generated_tokens",
        "marlaas_tenant_generated_tokens",
        "Tokens generated for its trained batches.",
    ),
    ("trained_tokens", "marlaas_tenant_trained_tokens", "Tokens trained on."),
    ("eval_tokens", "marlaas_tenant_eval_tokens", "Tokens its evals generated."),
)


class _JobsCollector(Collector):
    def __init__(self, store: JobStore):
        self.store = store

    def collect(self):
        counts = self.store.job_counts()
        jobs = GaugeMetricFamily(
            "marlaas_jobs", "Jobs by tenant and status.", labels=["tenant", "status"]
        )
        tenants = sorted({t for t, _ in counts})
        for tenant in tenants:
            for status in STATUSES:
                jobs.add_metric([tenant, status], counts.get((tenant, status), 0))
        yield jobs
        queue = GaugeMetricFamily(
            "marlaas_queue_length", "Jobs waiting in status queued (all tenants)."
        )
        queue.add_metric([], sum(n for (_, s), n in counts.items() if s == QUEUED))
        yield queue
        usage = self.store.usage_by_tenant()  # by tenant name
        for key, name, text in USAGE:
            family = CounterMetricFamily(name, text, labels=["tenant"])
            for tenant, u in usage.items():
                family.add_metric([tenant], u[key])
            yield family


class ServiceMetrics:
    """The service's metrics. ``tenant`` labels are tenant ids (``org-...``, the
    jobs' ``organization_id``)."""

    def __init__(self, store: JobStore | None = None):
        self.registry = CollectorRegistry(auto_describe=True)
        if store is not None:
            self.registry.register(_JobsCollector(store))
        self.ttfs = Histogram(
            "marlaas_ttfs_seconds",
            "Time to first step: first committed step minus job creation.",
            ["tenant"],
            buckets=TTFS_BUCKETS,
            registry=self.registry,
        )
        self.step = Histogram(
            "marlaas_step_seconds",
            "Wall time of one committed training step of a job.",
            ["tenant"],
            buckets=STEP_BUCKETS,
            registry=self.registry,
        )
        self.trainer_busy = Gauge(
            "marlaas_trainer_busy_fraction",
            "Fraction of recent wall time the trainers spent training (their mean).",
            registry=self.registry,
        )
        self.kv_usage = Gauge(
            "marlaas_server_kv_usage_fraction",
            "The rollout server's KV-cache usage (vllm:kv_cache_usage_perc).",
            registry=self.registry,
        )
        self.tool_calls = Counter(
            "marlaas_tool_calls",
            "Agent jobs' tool calls in committed steps (errors: calls the model "
            "saw an error for).",
            ["tenant", "outcome"],
            registry=self.registry,
        )
        self.tool_seconds = Histogram(
            "marlaas_tool_call_seconds",
            "Mean execution time of one tool call, per committed agent step.",
            ["tenant"],
            buckets=TOOL_BUCKETS,
            registry=self.registry,
        )
        self.discarded = Counter(
            "marlaas_discarded_groups",
            "Rollout groups dropped from committed steps (a tool's 5xx after its "
            "retries, an endpoint grader down, a failed episode).",
            ["tenant"],
            registry=self.registry,
        )
        self.requests = Counter(
            "marlaas_api_requests",
            "API requests by method, route and status code.",
            ["method", "route", "code"],
            registry=self.registry,
        )
        # The gauges' last values for the admin overview (None: never reported).
        self._busy: float | None = None
        self._kv: float | None = None

    # -- what the scheduler side calls -------------------------------------------
    def observe_ttfs(self, tenant: str, seconds: float) -> None:
        self.ttfs.labels(tenant).observe(seconds)

    def observe_step(self, tenant: str, seconds: float) -> None:
        self.step.labels(tenant).observe(seconds)

    def observe_tools(self, tenant: str, tools: dict | None, discarded: int) -> None:
        """A committed step's tool metrics (``StepRecord.tools``) and discards."""
        if discarded:
            self.discarded.labels(tenant).inc(discarded)
        if not tools:
            return
        self.tool_calls.labels(tenant, "ok").inc(tools["calls"] - tools["errors"])
        self.tool_calls.labels(tenant, "error").inc(tools["errors"])
        if tools["calls"]:
            self.tool_seconds.labels(tenant).observe(tools["latency_s_mean"])

    def set_trainer_busy(self, fraction: float) -> None:
        self._busy = min(max(fraction, 0.0), 1.0)
        self.trainer_busy.set(self._busy)

    def set_kv_usage(self, fraction: float) -> None:
        self._kv = min(max(fraction, 0.0), 1.0)
        self.kv_usage.set(self._kv)

    # -- what the API calls -------------------------------------------------------
    def observe_request(self, method: str, route: str, code: int) -> None:
        self.requests.labels(method, route, str(code)).inc()

    def snapshot(self) -> dict[str, float | None]:
        """The scheduler-reported gauges as last set."""
        return {"trainer_busy_fraction": self._busy, "kv_usage_fraction": self._kv}

    def render(self) -> bytes:
        return generate_latest(self.registry)
