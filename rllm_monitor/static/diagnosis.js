// Zero-reward diagnosis: per step, the zero-reward episodes broken down by reason, the trend of each reason over
// steps, example episodes one click away, and the groups that were all-zero / all-one (no learning signal).

import { align, Chart, PALETTE } from "./charts.js";
import { api, h, runHref } from "./util.js";

let cache = { run: null, at: 0, data: null };

/** The diagnosis of a run, cached for 5 s so the episodes view can reuse its reason names. */
export async function diagnosis(run) {
  if (cache.run === run && Date.now() - cache.at < 5000) return cache.data;
  const data = await api("diagnosis", { run });
  cache = { run, at: Date.now(), data };
  return data;
}

export async function diagnosisView(main, run) {
  const d = await diagnosis(run);
  const reasons = d.reasons || [];
  const steps = d.steps || [];
  if (!steps.length) {
    main.append(h("p", { class: "muted" }, "No episode files yet: nothing to diagnose."));
    return;
  }
  const totalZero = steps.reduce((a, s) => a + (s.zero_reward || 0), 0);
  const totalEp = steps.reduce((a, s) => a + (s.episodes || 0), 0);
  main.append(h("p", {}, `${totalZero} of ${totalEp} episodes earned zero reward. `,
    h("span", { class: "muted" }, "Counts are among zero-reward episodes; click a count to list those episodes, " +
      "or an example to open one.")));

  // trend of each reason over the training steps (eval files get their own chart)
  const grid = h("div", { class: "chart-grid" });
  main.append(grid);
  for (const [kind, title] of [["train", "Zero-reward reasons over training steps"],
    ["eval", "Zero-reward reasons over eval points"]]) {
    const rows = steps.filter((s) => (kind === "train" ? s.kind === "train" : s.kind !== "train"));
    if (rows.length < 2 || !reasons.length) continue; // a trend needs two points; one eval is the table
    const records = rows.map((s) => ({ step: s.step ?? 0, ...Object.fromEntries(reasons.map((r) =>
      [r, (s.reasons || {})[r] ?? 0])) }));
    // several eval files of one step (sampled + greedy) add up
    const merged = new Map();
    for (const r of records) {
      const m = merged.get(r.step) || { step: r.step };
      for (const k of reasons) m[k] = (m[k] || 0) + r[k];
      merged.set(r.step, m);
    }
    const { x, cols } = align([...merged.values()], reasons, "step");
    const chart = new Chart(grid, { id: `reasons-${kind}`, title, xLabel: "step" });
    chart.update(x, reasons.map((r, i) => ({ label: r, values: cols[r], color: PALETTE[i % PALETTE.length] })), x.length);
  }

  const head = ["file", "kind", "step", "episodes", "zero reward", ...reasons, "groups", "all-zero groups",
    "all-one groups"];
  const body = steps.map((s) => h("tr", { dataset: { file: s.file } },
    h("td", {}, h("a", { href: runHref(run, "file", s.file) }, s.file)),
    h("td", {}, s.kind ?? ""),
    h("td", { class: "num" }, s.step ?? ""),
    h("td", { class: "num", dataset: { testid: `diag-episodes-${s.file}` } }, s.episodes ?? 0),
    h("td", { class: "num", dataset: { testid: `diag-zero-${s.file}` } },
      h("a", { href: `${runHref(run, "file", s.file)}?reward=zero` }, String(s.zero_reward ?? 0))),
    reasons.map((r) => {
      const n = (s.reasons || {})[r] ?? 0;
      const examples = (s.examples || {})[r] || [];
      return h("td", { class: `num ${n ? "hot" : "muted"}`, dataset: { testid: `diag-cell-${s.file}-${r}`,
        count: String(n) } },
      n ? h("a", { href: `${runHref(run, "file", s.file)}?reward=zero&reason=${encodeURIComponent(r)}` }, String(n))
        : "0",
      examples.length ? h("div", { class: "examples" }, examples.map((i) =>
        h("a", { href: runHref(run, "episode", s.file, i), class: "chip", dataset: { testid: "diag-example" } },
          `#${i}`))) : null);
    }),
    h("td", { class: "num" }, s.groups ?? ""),
    h("td", { class: "num", dataset: { testid: `diag-allzero-${s.file}` } }, s.all_zero_groups ?? ""),
    h("td", { class: "num", dataset: { testid: `diag-allone-${s.file}` } }, s.all_one_groups ?? "")));
  main.append(h("div", { class: "scroll-x" }, h("table", { class: "grid", id: "diagnosis-table",
    dataset: { testid: "diagnosis-table" } }, h("thead", {}, h("tr", {}, head.map((t) => h("th", {}, t)))),
  h("tbody", {}, body))));
}
