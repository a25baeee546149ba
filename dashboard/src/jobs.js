// A tenant's jobs: status, progress, ETA, TTFS.

import { badge, clear, eta, h, progress, seconds, table, when } from "./dom.js";

export const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);

export async function renderJobs(api, root) {
  const jobs = await api.all("/v1/fine_tuning/jobs");
  const rows = jobs.map((j) => [
    h("a", { href: `#/jobs/${j.id}`, class: "job-link" }, j.id),
    j.fine_tuned_model || j.model,
    badge(j.status),
    progress(j.steps_done ?? 0, j.steps_total),
    TERMINAL.has(j.status) ? when(j.finished_at) : eta(j.estimated_finish),
    seconds(j.ttfs_s),
    when(j.created_at),
  ]);
  clear(
    root,
    h("h2", {}, "Jobs"),
    jobs.length === 0
      ? h("p", { class: "empty" }, "No jobs yet: create one with client.fine_tuning.jobs.create.")
      : table(
          ["job", "model", "status", "steps", "ETA / finished", "TTFS", "created"],
          rows,
          (i) => ({ "data-job": jobs[i].id, "data-status": jobs[i].status }),
        ),
  );
  return jobs.some((j) => !TERMINAL.has(j.status));
}
