// The operator's view (admin key): every tenant's jobs, the queue, trainer busy
// fraction, KV usage and the TTFS distribution, from /v1/admin/overview.

import { StepChart } from "./charts.js";
import { badge, clear, h, progress, seconds, table, when } from "./dom.js";

function percent(x) {
  return x === null || x === undefined ? "–" : `${(100 * x).toFixed(0)}%`;
}

export class AdminView {
  constructor(api, root) {
    this.api = api;
    this.root = root;
    this.chart = null;
  }

  build() {
    this.kpis = h("div", { class: "kpis" });
    this.queue = h("div", { class: "queue" });
    this.tenants = h("div", { class: "tenants" });
    this.jobs = h("div", { class: "all-jobs" });
    const charts = h("div", { class: "charts" });
    clear(
      this.root,
      h("h2", {}, "Service"),
      this.kpis,
      charts,
      h("h3", {}, "Queue"),
      this.queue,
      h("h3", {}, "Tenants: weight and usage"),
      this.tenants,
      h("h3", {}, "Every tenant's jobs"),
      this.jobs,
    );
    this.chart = new StepChart(charts, {
      title: "Time to first step (CDF)",
      name: "ttfs",
      xLabel: "TTFS (s)",
      yLabel: "fraction of jobs",
      steps: false,
      yRange: [0, 1],
    });
  }

  async refresh() {
    const o = await this.api.get("/v1/admin/overview");
    if (!this.chart) this.build();
    const kpi = (name, value) => h("div", { class: "kpi", "data-kpi": name }, h("span", { class: "kpi-value" }, value), h("span", { class: "kpi-name" }, name));
    clear(
      this.kpis,
      kpi("tenants", o.tenants.length),
      kpi("running", o.jobs.filter((j) => j.status === "running").length),
      kpi("queued", o.queue.length),
      kpi("trainer busy", percent(o.trainer_busy_fraction)),
      kpi("KV cache", percent(o.kv_usage_fraction)),
      kpi("TTFS p50", seconds(o.ttfs_p50_s)),
      kpi("TTFS p95", seconds(o.ttfs_p95_s)),
    );
    const ttfs = [...o.ttfs_s].sort((a, b) => a - b);
    this.chart.update(ttfs, [{ label: "jobs", values: ttfs.map((_, i) => (i + 1) / ttfs.length) }]);
    clear(
      this.queue,
      o.queue.length === 0
        ? h("p", { class: "empty" }, "Nothing is waiting.")
        : table(
            ["position", "tenant", "job", "waiting"],
            o.queue.map((q) => [q.position, q.tenant, q.job, seconds(o.generated_at - q.created_at)]),
          ),
    );
    clear(
      this.tenants,
      table(
        ["tenant", "weight", "jobs", "trainer", "generated tokens", "trained tokens", "eval tokens"],
        o.tenants.map((t) => [
          t.name,
          t.weight,
          t.jobs,
          seconds(t.usage?.trainer_s ?? 0),
          t.usage?.generated_tokens ?? 0,
          t.usage?.trained_tokens ?? 0,
          t.usage?.eval_tokens ?? 0,
        ]),
        (i) => ({ "data-tenant": o.tenants[i].name }),
      ),
    );
    clear(
      this.jobs,
      table(
        ["tenant", "job", "status", "steps", "TTFS", "created"],
        o.jobs.map((j) => [j.tenant, j.job, badge(j.status), progress(j.steps_done, j.steps_total), seconds(j.ttfs_s), when(j.created_at)]),
        (i) => ({ "data-job": o.jobs[i].job }),
      ),
    );
    return true; // the service keeps running: keep polling
  }

  resize() {
    this.chart?.plot?.setSize({ width: this.chart.width(), height: 220 });
  }
}

