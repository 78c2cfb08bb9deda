// Small helpers shared by every view: the API client, a DOM builder, formatting, and the hash-route helpers.
// Plain ES modules, no build step: the page is served as-is by `rllm view`.

const query = new URLSearchParams(location.search);
if (query.get("token")) sessionStorage.setItem("rllm-token", query.get("token"));
const TOKEN = sessionStorage.getItem("rllm-token");

/** GET /api/<path>?<params> → JSON; throws an Error whose message says which call failed and why. */
export async function api(path, params = {}) {
  const url = new URL("api/" + path, document.baseURI);
  for (const [k, v] of Object.entries(params)) {
    if (v !== undefined && v !== null && v !== "") url.searchParams.set(k, String(v));
  }
  const headers = TOKEN ? { Authorization: `Bearer ${TOKEN}` } : {};
  let resp;
  try {
    resp = await fetch(url, { headers, credentials: "same-origin" });
  } catch (err) {
    throw new Error(`cannot reach the server for /api/${path} (is \`rllm view\` still running?): ${err.message}`);
  }
  if (!resp.ok) {
    let detail = resp.statusText;
    try {
      const body = await resp.json();
      detail = body.error || body.message || JSON.stringify(body);
    } catch { /* not JSON */ }
    if (resp.status === 401) detail += " — open the page as /?token=YOUR_TOKEN";
    throw new Error(`/api/${path}: HTTP ${resp.status}: ${detail}`);
  }
  return resp.json();
}

/** h("div", {class: "x", onclick: f, dataset: {testid: "y"}}, child, "text", [more]) → Element. */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "dataset") Object.assign(el.dataset, v);
    else if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else if (k === "text") el.textContent = v;
    else if (k in el && typeof v !== "string") el[k] = v;
    else el.setAttribute(k, v === true ? "" : v);
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === undefined || c === null || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

export function fmt(v, digits = 3) {
  if (v === undefined || v === null || Number.isNaN(v)) return "–";
  if (typeof v !== "number") return String(v);
  if (Number.isInteger(v)) return String(v);
  const a = Math.abs(v);
  if (a !== 0 && (a < 1e-3 || a >= 1e5)) return v.toExponential(2);
  return v.toFixed(digits);
}

// A rate in [0, 1] (reward, accuracy): always three decimals, so 1.0 reads "1.000" beside "0.963", not "1".
export function fmtRate(v) {
  return typeof v === "number" && Number.isFinite(v) ? v.toFixed(3) : fmt(v);
}

export function ago(t) {
  if (!t) return "–";
  const ms = typeof t === "number" ? t * 1000 : Date.parse(t);
  if (Number.isNaN(ms)) return String(t);
  const s = Math.max(0, (Date.now() - ms) / 1000);
  if (s < 60) return `${Math.round(s)} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${(s / 3600).toFixed(1)} h ago`;
  return new Date(ms).toLocaleString();
}

export function badge(status) {
  return h("span", { class: `badge status-${status || "unknown"}`, dataset: { testid: "status-badge" } },
    status || "unknown");
}

/** Run ids are paths relative to the view root; they travel in the hash URL-encoded (slashes included). */
export const enc = (s) => encodeURIComponent(s);
export const runHref = (id, ...rest) => "#/run/" + [enc(id), ...rest.map((r) => enc(String(r)))].join("/");

export function hashParams() {
  const i = location.hash.indexOf("?");
  return new URLSearchParams(i < 0 ? "" : location.hash.slice(i + 1));
}

export function setHashParams(params) {
  const base = location.hash.split("?")[0];
  const qs = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null && v !== "") qs.set(k, v);
  const s = qs.toString();
  location.hash = s ? `${base}?${s}` : base;
}

export function showError(err) {
  const b = document.getElementById("banner");
  b.textContent = err instanceof Error ? err.message : String(err);
  b.classList.remove("hidden");
  console.error(err);
}

export function clearError() {
  document.getElementById("banner").classList.add("hidden");
}

/** Per-view lifetime: timers and observers registered here are stopped when the route changes. */
export const life = {
  timers: [],
  cleanups: [],
  every(ms, fn) { this.timers.push(setInterval(fn, ms)); },
  onLeave(fn) { this.cleanups.push(fn); },
  reset() {
    this.timers.forEach(clearInterval);
    this.cleanups.forEach((f) => { try { f(); } catch (e) { console.error(e); } });
    this.timers = [];
    this.cleanups = [];
  },
};

export function pre(text, cls = "") {
  return h("pre", { class: cls }, text ?? "");
}

export function json(v) {
  return JSON.stringify(v, null, 2);
}
