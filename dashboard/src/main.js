// The dashboard's entry: sign-in with an API key, hash routes (#/ jobs,
// #/jobs/<id> one job, #/admin the operator's view) and polling while
// something runs.

import "uplot/dist/uPlot.min.css";
import "./app.css";
import { AdminView } from "./admin.js";
import { Api, ApiError, forgetKey, isAdminKey, storedKey, storeKey } from "./api.js";
import { clear, h } from "./dom.js";
import { JobView } from "./job.js";
import { renderJobs } from "./jobs.js";

const POLL_MS = Number(document.body.dataset.pollMs || 2000);
const app = document.getElementById("app");
const bar = document.getElementById("who");
let timer = null;
let view = null;

function masked(key) {
  return `${key.slice(0, 14)}…${key.slice(-4)}`;
}

function showError(err) {
  const box = document.getElementById("error");
  if (!err) {
    box.hidden = true;
    return;
  }
  box.hidden = false;
  box.textContent = err.message;
}

function signIn(message) {
  clearTimeout(timer);
  view = null;
  clear(bar);
  const input = h("input", {
    type: "password",
    id: "api-key",
    name: "api-key",
    autocomplete: "off",
    placeholder: "sk-marlaas-...",
    "aria-label": "API key",
    required: true,
  });
  const form = h(
    "form",
    {
      class: "sign-in",
      onsubmit: (ev) => {
        ev.preventDefault();
        storeKey(input.value.trim());
        route();
      },
    },
    h("h2", {}, "Sign in"),
    h("p", {}, "Your tenant API key, or the operator's admin key. It stays in this tab's session storage."),
    input,
    h("button", { type: "submit" }, "Sign in"),
    message ? h("p", { class: "error", id: "sign-in-error" }, message) : null,
  );
  clear(app, form);
  input.focus();
}

function signOut() {
  forgetKey();
  location.hash = "#/";
  signIn();
}

async function tick() {
  clearTimeout(timer);
  const mine = view;
  try {
    const live = await mine.refresh();
    if (mine !== view) return; // the route changed while this poll ran
    showError(null);
    document.body.dataset.refreshed = String(Date.now());
    if (live) timer = setTimeout(tick, POLL_MS);
  } catch (err) {
    if (mine !== view) return;
    if (err instanceof ApiError && err.status === 401) {
      forgetKey();
      signIn(`The key was not accepted: ${err.message}`);
      return;
    }
    showError(err);
    timer = setTimeout(tick, POLL_MS * 2);
  }
}

function route() {
  const key = storedKey();
  if (!key) {
    signIn();
    return;
  }
  const api = new Api(key);
  const admin = isAdminKey(key);
  clear(
    bar,
    h("span", { class: "who", "data-role": admin ? "admin" : "tenant" }, admin ? "operator" : "tenant", " ", h("code", {}, masked(key))),
    h("button", { type: "button", id: "sign-out", onclick: signOut }, "Sign out"),
  );
  const hash = location.hash.replace(/^#/, "") || "/";
  const job = hash.match(/^\/jobs\/([A-Za-z0-9_-]+)$/);
  if (admin) view = new AdminView(api, app);
  else if (job) view = new JobView(api, app, job[1]);
  else view = { refresh: () => renderJobs(api, app) };
  clear(app, h("p", { class: "loading" }, "Loading…"));
  tick();
}

window.addEventListener("hashchange", route);
window.addEventListener("resize", () => view?.resize?.());
route();
