// One job: charts over steps by its method (reinforcement: train and validation
// reward, per grader, loss, step timing, tools; supervised: loss and token
// accuracy; DPO: preference loss, accuracy and reward margin), events,
// checkpoints and the eval sample viewer.

import { StepChart } from "./charts.js";
import { badge, clear, eta, h, num, progress, seconds, table, when } from "./dom.js";
import { TERMINAL } from "./jobs.js";

// Per step, the newest metrics event (a restart may record a step again).
export function metricsByStep(events) {
  const by = new Map();
  for (const e of events) {
    if (e.type !== "metrics" || !e.data || e.data.step === undefined) continue;
    const old = by.get(e.data.step);
    if (!old || old.created_at <= e.created_at) by.set(e.data.step, e);
  }
  return [...by.keys()].sort((a, b) => a - b).map((k) => by.get(k).data);
}

function col(rows, f) {
  return rows.map((r) => {
    const v = f(r);
    return v === undefined || v === null || Number.isNaN(v) ? null : v;
  });
}

function graderSeries(rows) {
  const names = [];
  for (const r of rows) {
    for (const g of r.scores?.graders || []) if (!names.includes(g.name)) names.push(g.name);
  }
  const grader = (r, name) => (r.scores?.graders || []).find((g) => g.name === name);
  const out = [];
  for (const name of names) {
    out.push({ label: `${name} train`, values: col(rows, (r) => grader(r, name)?.train_reward_mean) });
    const valid = col(rows, (r) => grader(r, name)?.valid_reward_mean);
    if (valid.some((v) => v !== null)) out.push({ label: `${name} valid`, values: valid, dash: [6, 4] });
  }
  return out;
}

// The charts of a job's page, by its method: each a title, a y label and its
// series over the metrics events' steps.
const stepTiming = (rows) => {
  const t = (k) => col(rows, (r) => r.timing?.step?.[k]);
  return [
    { label: "sampling", values: t("sampling") },
    { label: "training", values: t("training") },
    { label: "eval", values: t("eval") },
    { label: "full iteration", values: t("full_iteration") },
  ];
};
// train_*, valid_* and full_valid_* of one score (supervised and DPO jobs).
const splits = (rows, score, label = "") => [
  { label: `train${label}`, values: col(rows, (r) => r[`train_${score}`]) },
  { label: `validation${label}`, values: col(rows, (r) => r[`valid_${score}`]), dash: [6, 4] },
  { label: `full validation${label}`, values: col(rows, (r) => r[`full_valid_${score}`]), dash: [2, 3] },
];

export const METHOD_CHARTS = {
  reinforcement: [
    {
      name: "reward", title: "Reward", yLabel: "mean reward",
      series: (rows) => [
        { label: "train", values: col(rows, (r) => r.scores?.train_reward_mean) },
        { label: "validation", values: col(rows, (r) => r.scores?.valid_reward_mean), dash: [6, 4] },
      ],
    },
    { name: "graders", title: "Reward per grader", yLabel: "mean score", series: graderSeries },
    {
      name: "loss", title: "Loss", yLabel: "loss",
      series: (rows) => [{ label: "loss", values: col(rows, (r) => r.marlaas?.loss) }],
    },
    { name: "timing", title: "Step timing", yLabel: "seconds", series: stepTiming },
    {
      name: "tools", title: "Tool calls (agent jobs)", yLabel: "per rollout / count / s",
      series: (rows) => {
        const tool = (k) => col(rows, (r) => r.tools?.[k]);
        return [
          { label: "calls per rollout", values: tool("calls_per_rollout") },
          { label: "errors", values: tool("errors") },
          { label: "latency (s)", values: tool("latency_s_mean") },
          { label: "discarded groups", values: col(rows, (r) => r.discarded_groups), dash: [6, 4] },
        ];
      },
    },
  ],
  supervised: [
    { name: "loss", title: "Loss", yLabel: "mean token NLL", series: (rows) => splits(rows, "loss") },
    {
      name: "token-accuracy", title: "Token accuracy", yLabel: "share of tokens",
      series: (rows) => splits(rows, "mean_token_accuracy"),
    },
    { name: "timing", title: "Step timing", yLabel: "seconds", series: stepTiming },
  ],
  dpo: [
    { name: "loss", title: "Preference loss", yLabel: "loss", series: (rows) => splits(rows, "loss") },
    {
      name: "preference-accuracy", title: "Preference accuracy", yLabel: "share of pairs",
      series: (rows) => splits(rows, "preference_accuracy"),
    },
    {
      name: "reward-margin", title: "Reward margin", yLabel: "beta x log-ratio",
      series: (rows) => splits(rows, "reward_margin").slice(0, 2),
    },
    { name: "timing", title: "Step timing", yLabel: "seconds", series: stepTiming },
  ],
};

// The checkpoints table's score columns, by method.
const CHECKPOINT_SCORES = {
  reinforcement: [["train reward", "train_reward_mean"], ["validation reward", "valid_reward_mean"]],
  supervised: [
    ["train loss", "train_loss"], ["validation loss", "valid_loss"],
    ["full validation loss", "full_valid_loss"], ["train token accuracy", "train_mean_token_accuracy"],
  ],
  dpo: [
    ["train loss", "train_loss"], ["validation loss", "valid_loss"],
    ["preference accuracy", "train_preference_accuracy"],
    ["validation preference accuracy", "valid_preference_accuracy"],
  ],
};

const methodOf = (job) => (METHOD_CHARTS[job.method?.type] ? job.method.type : "reinforcement");

export class JobView {
  constructor(api, root, jobId) {
    this.api = api;
    this.root = root;
    this.jobId = jobId;
    this.events = new Map();
    this.charts = null;
    this.run = null; // the sample viewer's chosen run (null: the newest)
    this.status = "";
    this.samplesKey = null;
  }

  build(job) {
    this.head = h("div", { class: "job-head" });
    const charts = h("div", { class: "charts", "data-method": methodOf(job) });
    this.method = methodOf(job);
    this.charts = METHOD_CHARTS[this.method].map((c) => ({
      ...c,
      chart: new StepChart(charts, { title: c.title, name: c.name, yLabel: c.yLabel }),
    }));
    this.checkpoints = h("div", { class: "checkpoints" });
    this.samples = h("div", { class: "samples" });
    this.eventList = h("div", { class: "events" });
    clear(
      this.root,
      h("p", {}, h("a", { href: "#/" }, "← all jobs")),
      this.head,
      charts,
      h("h3", {}, "Samples"),
      this.samples,
      h("h3", {}, "Checkpoints"),
      this.checkpoints,
      h("h3", {}, "Events"),
      this.eventList,
    );
  }

  async refresh() {
    const base = `/v1/fine_tuning/jobs/${encodeURIComponent(this.jobId)}`;
    const job = await this.api.get(base);
    if (!this.charts) this.build(job);
    await this.api.newer(`${base}/events`, this.events);
    const ckpts = await this.api.all(`${base}/checkpoints`);
    this.renderHead(job);
    this.renderCharts(metricsByStep([...this.events.values()]));
    this.renderCheckpoints(ckpts);
    this.renderEvents([...this.events.values()]);
    await this.renderSamples(job);
    return !TERMINAL.has(job.status);
  }

  renderHead(job) {
    clear(
      this.head,
      h("h2", {}, job.id, " ", badge(job.status)),
      h(
        "dl",
        { class: "facts" },
        h("dt", {}, "steps"), h("dd", { "data-fact": "steps" }, progress(job.steps_done ?? 0, job.steps_total)),
        h("dt", {}, "ETA"), h("dd", {}, TERMINAL.has(job.status) ? `finished ${when(job.finished_at)}` : eta(job.estimated_finish)),
        h("dt", {}, "TTFS"), h("dd", {}, seconds(job.ttfs_s)),
        h("dt", {}, "model"), h("dd", {}, job.fine_tuned_model || job.model),
        h("dt", {}, "trained tokens"), h("dd", {}, job.trained_tokens ?? "–"),
        job.error ? [h("dt", {}, "error"), h("dd", { class: "error" }, job.error.message)] : null,
      ),
    );
  }

  renderCharts(rows) {
    const xs = rows.map((r) => r.step);
    for (const c of this.charts) c.chart.update(xs, c.series(rows));
  }

  renderCheckpoints(ckpts) {
    const rows = [...ckpts].sort((a, b) => b.step_number - a.step_number);
    clear(
      this.checkpoints,
      rows.length === 0
        ? h("p", { class: "empty" }, "No checkpoint yet.")
        : table(
            ["step", "model", ...CHECKPOINT_SCORES[this.method].map(([label]) => label), "created"],
            rows.map((c) => [
              c.step_number,
              h("code", {}, c.fine_tuned_model_checkpoint),
              ...CHECKPOINT_SCORES[this.method].map(([, key]) => num(c.metrics?.[key])),
              when(c.created_at),
            ]),
            (i) => ({ "data-step": rows[i].step_number }),
          ),
    );
  }

  renderEvents(events) {
    // Newest first; within a second by event number (ids are ftevent-<n>).
    const n = (e) => Number(e.id.split("-").pop());
    const rows = events.sort((a, b) => b.created_at - a.created_at || n(b) - n(a)).slice(0, 50);
    clear(
      this.eventList,
      table(
        ["time", "level", "message"],
        rows.map((e) => [when(e.created_at), e.level, e.message]),
        (i) => ({ class: `level-${rows[i].level}` }),
      ),
    );
  }

  async renderSamples(job) {
    if (!job.eval_id) {
      clear(this.samples, h("p", { class: "empty" }, "This job has no validation_file: no eval samples."));
      return;
    }
    const evalPath = `/v1/evals/${encodeURIComponent(job.eval_id)}/runs`;
    const runs = await this.api.all(evalPath, { order: "asc" });
    if (runs.length === 0) {
      clear(this.samples, h("p", { class: "empty" }, "No validation run yet."));
      return;
    }
    const chosen = runs.find((r) => r.id === this.run) || runs[runs.length - 1];
    const picker = h(
      "select",
      { "aria-label": "validation run", class: "run-picker", onchange: (ev) => { this.run = ev.target.value; this.renderSamples(job); } },
      runs.map((r) =>
        h("option", { value: r.id, selected: r.id === chosen.id }, `${r.name}: mean ${num(r.reward_mean)} (${r.result_counts.passed}/${r.result_counts.total} passed)`),
      ),
    );
    const filter = h(
      "select",
      { "aria-label": "status", class: "status-picker", onchange: (ev) => { this.status = ev.target.value; this.renderSamples(job); } },
      ["", "pass", "fail", "error"].map((s) => h("option", { value: s, selected: s === this.status }, s || "all")),
    );
    const key = `${chosen.id}|${this.status}|${chosen.status}`;
    if (key === this.samplesKey) return; // this run's items are on screen already
    const items = await this.api.all(`${evalPath}/${encodeURIComponent(chosen.id)}/output_items`, {
      status: this.status || undefined,
    });
    // A tool agent's output is its conversation: each turn with its role, the
    // calls it made (name and arguments) and the tools' outputs.
    const call = (c) => `  -> ${c.function?.name}(${c.function?.arguments})`;
    const turn = (m, many) => [many ? `[${m.role}] ${m.content ?? ""}` : m.content, ...(m.tool_calls || []).map(call)].join("\n");
    const text = (msgs) => (msgs || []).map((m) => turn(m, (msgs || []).length > 1)).join("\n");
    clear(
      this.samples,
      h("div", { class: "pickers" }, picker, filter),
      table(
        ["#", "prompt", "output", "scores", "status"],
        items.map((it) => [
          it.datasource_item_id,
          h("pre", {}, text(it.sample?.input)),
          h("pre", {}, it.sample?.error?.message ? `error: ${it.sample.error.message}` : text(it.sample?.output)),
          h("ul", { class: "scores" }, (it.results || []).map((r) => h("li", {}, `${r.name}: ${num(r.score)}`))),
          badge(it.status),
        ]),
        (i) => ({ "data-item": items[i].datasource_item_id }),
      ),
    );
    this.samplesKey = key;
    this.samples.dataset.run = chosen.id;
    this.samples.dataset.items = String(items.length);
  }

  resize() {
    for (const c of Object.values(this.charts || {})) c.plot?.setSize({ width: c.width(), height: 220 });
  }
}
