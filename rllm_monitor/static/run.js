// The run page: live curves (polling /api/metrics?since=next while the run is running), config and log tail.

import { align, Chart, countPoints, PALETTE, withSmoothing } from "./charts.js";
import { api, fmt, fmtRate, h, json, life } from "./util.js";

/** Which metrics each chart shows; `match` charts take every key matching the pattern (e.g. every phase). */
export const CHARTS = [
  { id: "reward", title: "Reward (mean)", keys: [["reward/mean", "train"], ["val/reward/mean", "eval"],
    ["val_greedy/reward/mean", "eval greedy"]] },
  { id: "accuracy", title: "Accuracy", keys: [["reward/accuracy", "train"], ["val/reward/accuracy", "eval"],
    ["val_greedy/reward/accuracy", "eval greedy"]] },
  { id: "length", title: "Response length (tokens)", keys: [["episode/response_tokens_mean", "mean"],
    ["episode/response_tokens_max", "max"], ["val/episode/response_tokens_mean", "eval mean"]] },
  { id: "kl", title: "KL: update vs sampler, vs start policy", keys: [["train/approx_kl", "update vs sampler (approx)"], ["train/kl", "vs start (--kl-coef)"]] },
  { id: "clip", title: "Clip fraction", keys: [["train/clip_frac", "clip frac"], ["train/clip_frac_lower", "lower"]] },
  { id: "entropy", title: "Entropy", keys: [["train/entropy", "entropy"]] },
  { id: "grad-norm", title: "Grad norm", keys: [["train/grad_norm", "grad norm"]] },
  { id: "throughput", title: "Tokens / s", keys: [["throughput/tokens_per_s", "step"], ["train/tokens_per_s", "trainer"]] },
  { id: "phases", title: "Seconds per phase", match: /^time\/(.+)_s$/ },
  { id: "reasons", title: "Reward reasons (fraction of episodes)", match: /^reason\/(.+)$/ },
  { id: "groups", title: "Groups without signal (fraction)", keys: [["groups/frac_too_hard", "all zero"],
    ["groups/frac_too_easy", "all one"]] },
];

/** The [key, label] pairs of one chart present in these records (match charts: every matching key). */
export function chartKeys(spec, present) {
  if (spec.keys) return spec.keys.filter(([k]) => present.has(k));
  return [...present].filter((k) => spec.match.test(k)).sort().map((k) => [k, k.match(spec.match)[1]]);
}

const settings = {
  get smoothing() { return Number(localStorage.getItem("rllm-smoothing") ?? 0); },
  set smoothing(v) { localStorage.setItem("rllm-smoothing", String(v)); },
  get axis() { return localStorage.getItem("rllm-axis") || "step"; },
  set axis(v) { localStorage.setItem("rllm-axis", v); },
};

export function chartControls(onChange) {
  const value = h("span", { class: "muted", id: "smoothing-value" }, settings.smoothing.toFixed(2));
  const slider = h("input", { type: "range", min: "0", max: "0.99", step: "0.01", id: "smoothing",
    dataset: { testid: "smoothing" }, value: String(settings.smoothing),
    oninput: (e) => { settings.smoothing = Number(e.target.value); value.textContent = settings.smoothing.toFixed(2);
      onChange(); } });
  const axisBtn = h("button", { id: "axis-toggle", dataset: { testid: "axis-toggle" },
    onclick: () => { settings.axis = settings.axis === "step" ? "time" : "step"; axisBtn.textContent = label();
      onChange(); } });
  const label = () => `x axis: ${settings.axis === "step" ? "step" : "seconds"}`;
  axisBtn.textContent = label();
  return h("div", { class: "controls" }, h("label", {}, "smoothing ", slider, " ", value), axisBtn);
}

export const axisLabel = () => (settings.axis === "step" ? "step" : "seconds since start");

export async function curvesView(main, run, getStatus) {
  let records = [];
  let next = 0;
  let partial = 0;
  const charts = new Map();
  const grid = h("div", { class: "chart-grid", dataset: { testid: "chart-grid" } });
  const live = h("span", { class: "live", id: "live-indicator", dataset: { testid: "live-indicator" } });
  const note = h("div", { class: "muted", id: "metrics-note" });
  const errors = h("div", { id: "run-errors" });
  main.append(h("div", { class: "toolbar" }, chartControls(() => draw(true)), live), note, errors, grid);

  function draw(rebuild = false) {
    const present = new Set();
    for (const r of records) for (const k of Object.keys(r)) if (typeof r[k] === "number") present.add(k);
    const axis = settings.axis;
    if (rebuild) { charts.forEach((c) => c.destroy()); charts.clear(); grid.textContent = ""; }
    for (const spec of CHARTS) {
      const keys = chartKeys(spec, present);
      if (!keys.length && spec.id !== "reward") continue;
      let chart = charts.get(spec.id);
      if (!chart) {
        chart = new Chart(grid, { id: spec.id, title: spec.title, xLabel: axisLabel() });
        charts.set(spec.id, chart);
      }
      const { x, cols } = align(records, keys.map(([k]) => k), axis);
      const specs = keys.map(([k, label], i) => ({ label, values: cols[k], color: PALETTE[i % PALETTE.length],
        points: k.startsWith("val"), dash: k.startsWith("val") ? [6, 4] : undefined }));
      chart.update(x, withSmoothing(specs, settings.smoothing), keys.length ? countPoints(cols[keys[0][0]]) : 0);
      if (spec.id === "reward") {
        const evalKey = keys.find(([k]) => k.startsWith("val"));
        chart.box.dataset.evalPoints = String(evalKey ? countPoints(cols[evalKey[0]]) : 0);
      }
    }
    const errs = records.filter((r) => r.kind === "error");
    errors.textContent = "";
    for (const e of errs.slice(-5)) {
      errors.append(h("div", { class: "error-record" }, `error at step ${e.step ?? "?"}: ${e.error ?? e.message ?? json(e)}`));
    }
    note.textContent = `${records.length} metric records` +
      (partial ? ` · ${partial} partial line(s) ignored (still being written, or cut off)` : "");
  }

  async function load() {
    const res = await api("metrics", { run, since: next });
    partial = res.partial_lines ?? 0;
    const fresh = res.records || [];
    next = res.next ?? next + fresh.length;
    records = records.concat(fresh);
    return fresh.length;
  }

  await load();
  draw();
  let tick = 0;
  const setLive = (status) => {
    live.textContent = status === "running" ? "● live (every 2 s)" : "";
    live.classList.toggle("on", status === "running");
  };
  setLive(getStatus.cached());
  let busy = false;
  life.every(2000, async () => {
    if (busy) return; // a slow server: never stack polls
    busy = true;
    tick += 1;
    try {
      let status = getStatus.cached();
      if (tick % 5 === 0) status = await getStatus.fresh(); // a stopped run is re-checked every 10 s
      setLive(status);
      if ((status === "running" || tick % 5 === 0) && (await load())) draw();
    } catch (err) {
      live.textContent = `live update failed: ${err.message}`;
    } finally {
      busy = false;
    }
  });
}

export async function configView(main, run) {
  const res = await api("config", { run });
  const cfg = res.config || {};
  const rows = Object.entries(cfg).map(([k, v]) =>
    h("tr", {}, h("th", {}, k), h("td", {}, h("code", {}, typeof v === "object" && v !== null ? json(v) : String(v)))));
  main.append(
    h("table", { class: "kv", id: "config-table", dataset: { testid: "config-table" } }, h("tbody", {}, rows)),
    h("details", {}, h("summary", {}, "config.yaml"), h("pre", { id: "config-text" }, res.text || "(no config.yaml)")),
  );
}

export async function logView(main, run, getStatus) {
  let lines = 200;
  const out = h("pre", { class: "log", id: "log-text", dataset: { testid: "log-text" } });
  const pick = h("select", { onchange: (e) => { lines = Number(e.target.value); refresh(); } },
    [200, 1000, 5000].map((n) => h("option", { value: String(n) }, `last ${n} lines`)));
  main.append(h("div", { class: "toolbar" }, pick, h("button", { onclick: () => refresh() }, "refresh")), out);
  async function refresh() {
    const res = await api("log", { run, lines });
    const atBottom = out.scrollTop + out.clientHeight >= out.scrollHeight - 4;
    out.textContent = (res.lines || []).join("\n") || "(log is empty)";
    if (atBottom) out.scrollTop = out.scrollHeight;
  }
  await refresh();
  life.every(2000, () => { if (getStatus.cached() === "running") refresh().catch(() => {}); });
}

export function runSummary(info) {
  if (!info) return h("span");
  const bits = [["kind", info.kind], ["benchmark", info.benchmark], ["model", info.model], ["backend", info.backend],
    ["step", info.max_steps ? `${info.step ?? 0}/${info.max_steps}` : info.step], ["reward", fmtRate(info.reward)],
    ["accuracy", fmtRate(info.accuracy)], ["val acc", fmtRate(info.val_accuracy)]];
  return h("div", { class: "summary" }, bits.filter(([, v]) => v !== undefined && v !== null && v !== "–")
    .map(([k, v]) => h("span", { class: "fig" }, h("span", { class: "muted" }, k), " ", String(v))),
  info.error ? h("div", { class: "error-record" }, info.error) : null);
}
