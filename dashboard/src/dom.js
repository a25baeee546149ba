// DOM helpers. Text always goes in through textContent: job names, model
// outputs and error messages are tenant data, never markup.

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

export function clear(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

export function table(headers, rows, rowAttrs = () => ({})) {
  return h(
    "table",
    {},
    h("thead", {}, h("tr", {}, headers.map((x) => h("th", {}, x)))),
    h(
      "tbody",
      {},
      rows.map((r, i) => h("tr", rowAttrs(i), r.map((c) => h("td", {}, c)))),
    ),
  );
}

export function progress(done, total) {
  const bar = h("span", { class: "bar-fill" });
  const frac = total > 0 ? Math.min(1, done / total) : 0;
  bar.style.width = `${(100 * frac).toFixed(1)}%`; // CSSOM: allowed by the CSP
  return h(
    "span",
    { class: "progress" },
    h("span", { class: "bar" }, bar),
    h("span", { class: "progress-text" }, `${done}/${total ?? "?"}`),
  );
}

export function badge(status) {
  return h("span", { class: `badge status-${status}` }, status);
}

export function num(x, digits = 3) {
  if (x === null || x === undefined || Number.isNaN(x)) return "–";
  return Number(x).toFixed(digits);
}

export function seconds(s) {
  if (s === null || s === undefined) return "–";
  if (s < 120) return `${s.toFixed(1)} s`;
  if (s < 7200) return `${(s / 60).toFixed(1)} min`;
  return `${(s / 3600).toFixed(1)} h`;
}

export function when(ts) {
  if (!ts) return "–";
  return new Date(ts * 1000).toLocaleString();
}

export function eta(ts, now = Date.now() / 1000) {
  if (!ts) return "–";
  const left = ts - now;
  return left <= 0 ? "any moment" : `in ${seconds(left)}`;
}
