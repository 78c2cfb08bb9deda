// The runs list (status, key figures, checkboxes) and the compare view overlaying chosen runs' curves.

import { align, Chart, countPoints, PALETTE, withSmoothing } from "./charts.js";
import { axisLabel, chartControls, CHARTS } from "./run.js";
import { ago, api, badge, enc, fmtRate, h, life, runHref } from "./util.js";

let runsCache = { at: 0, data: null };

/** /api/runs, shared by the views; `maxAge` ms lets several callers of one moment share one request. */
export async function runs(maxAge = 1500) {
  if (runsCache.data && Date.now() - runsCache.at < maxAge) return runsCache.data;
  const data = await api("runs");
  runsCache = { at: Date.now(), data };
  const root = document.getElementById("root-path");
  if (root) root.textContent = data.root || "";
  return data;
}

const chosen = new Set(JSON.parse(sessionStorage.getItem("rllm-compare") || "[]"));
const saveChosen = () => sessionStorage.setItem("rllm-compare", JSON.stringify([...chosen]));

export async function runsView(main) {
  const table = h("table", { class: "grid", id: "runs-table", dataset: { testid: "runs-table" } });
  const compareBtn = h("button", { id: "compare-button", dataset: { testid: "compare-button" },
    onclick: () => { location.hash = "#/compare/" + [...chosen].map(enc).join(","); } });
  const refreshBtn = () => {
    compareBtn.textContent = `compare ${chosen.size} selected`;
    compareBtn.disabled = chosen.size < 1;
  };
  main.append(h("div", { class: "toolbar" }, h("h2", {}, "Runs"), compareBtn), table);

  function fill(data) {
    const list = data.runs || [];
    table.textContent = "";
    table.append(h("thead", {}, h("tr", {}, ["", "run", "status", "kind", "benchmark", "model", "backend", "step",
      "reward", "accuracy", "val acc", "updated"].map((t) => h("th", {}, t)))));
    const body = h("tbody");
    for (const r of list) {
      body.append(h("tr", { dataset: { runId: r.id, status: r.status } },
        h("td", {}, h("input", { type: "checkbox", class: "pick", dataset: { testid: "compare-pick", run: r.id },
          checked: chosen.has(r.id),
          onchange: (e) => { if (e.target.checked) chosen.add(r.id); else chosen.delete(r.id); saveChosen();
            refreshBtn(); } })),
        h("td", {}, h("a", { href: runHref(r.id), dataset: { testid: "run-link" } }, r.id || "."),
          r.error ? h("div", { class: "error-text small" }, String(r.error).slice(0, 160)) : null),
        h("td", {}, badge(r.status)),
        h("td", {}, r.kind ?? ""),
        h("td", {}, r.benchmark ?? ""),
        h("td", {}, r.model ?? ""),
        h("td", {}, r.backend ?? ""),
        h("td", { class: "num" }, r.max_steps ? `${r.step ?? 0}/${r.max_steps}` : (r.step ?? "")),
        h("td", { class: "num" }, fmtRate(r.reward)),
        h("td", { class: "num" }, fmtRate(r.accuracy)),
        h("td", { class: "num" }, fmtRate(r.val_accuracy)),
        h("td", { class: "muted" }, ago(r.updated))));
    }
    if (!list.length) body.append(h("tr", {}, h("td", { colspan: "12", class: "muted" }, "no runs below this folder")));
    table.append(body);
    refreshBtn();
  }

  fill(await runs(0));
  life.every(5000, async () => { try { fill(await runs(0)); } catch { /* banner shows on navigation */ } });
}

export async function compareView(main, ids) {
  main.append(h("h2", {}, `Compare ${ids.length} run(s)`));
  const all = new Map();
  await Promise.all(ids.map(async (id) => {
    const res = await api("metrics", { run: id, since: 0 });
    all.set(id, { records: res.records || [], next: res.next ?? 0 });
  }));
  const grid = h("div", { class: "chart-grid", dataset: { testid: "compare-grid" } });
  const charts = new Map();
  main.append(h("div", { class: "toolbar" }, chartControls(() => draw(true))), grid);
  // one line per run: the chart's first metric (train), then its first eval metric as dots
  function draw(rebuild = false) {
    if (rebuild) { charts.forEach((c) => c.destroy()); charts.clear(); grid.textContent = ""; }
    for (const spec of CHARTS.filter((c) => c.keys)) {
      const [key] = spec.keys[0];
      const evalKey = spec.keys.find(([k]) => k.startsWith("val"))?.[0];
      const merged = [];
      const colKeys = [];
      ids.forEach((id, i) => {
        for (const r of all.get(id).records) {
          const row = { step: r.step, time: r.time };
          if (typeof r[key] === "number") row[`${i}:${key}`] = r[key];
          if (evalKey && typeof r[evalKey] === "number") row[`${i}:${evalKey}`] = r[evalKey];
          merged.push(row);
        }
        colKeys.push(`${i}:${key}`);
        if (evalKey) colKeys.push(`${i}:${evalKey}`);
      });
      const { x, cols } = align(merged, colKeys, localStorage.getItem("rllm-axis") || "step");
      const specs = [];
      ids.forEach((id, i) => {
        const color = PALETTE[i % PALETTE.length];
        if (countPoints(cols[`${i}:${key}`])) specs.push({ label: id, values: cols[`${i}:${key}`], color });
        if (evalKey && countPoints(cols[`${i}:${evalKey}`])) {
          specs.push({ label: `${id} (eval)`, values: cols[`${i}:${evalKey}`], color, points: true, dash: [6, 4] });
        }
      });
      if (!specs.length) continue;
      let chart = charts.get(spec.id);
      if (!chart) charts.set(spec.id, (chart = new Chart(grid, { id: `compare-${spec.id}`, title: spec.title,
        xLabel: axisLabel() })));
      chart.update(x, withSmoothing(specs, Number(localStorage.getItem("rllm-smoothing") ?? 0)), x.length);
    }
  }
  draw();
  let tick = 0;
  life.every(2000, async () => {
    tick += 1;
    let grew = false;
    const status = new Map(((await runs(1500).catch(() => ({ runs: [] }))).runs || []).map((r) => [r.id, r.status]));
    for (const id of ids) {
      if (status.get(id) !== "running" && tick % 5 !== 0) continue; // stopped runs: every 10 s
      const cur = all.get(id);
      try {
        const res = await api("metrics", { run: id, since: cur.next });
        if ((res.records || []).length) { cur.records = cur.records.concat(res.records); grew = true; }
        cur.next = res.next ?? cur.next;
      } catch { /* keep what we have */ }
    }
    if (grew) draw();
  });
}
