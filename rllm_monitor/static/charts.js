// Line charts on uPlot (vendored, global `uPlot`): one helper turns metric records into aligned series, one class
// owns a chart that can be fed new data in place (live updates call setData, not a redraw from scratch).

import { h, life } from "./util.js";

export const PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777",
  "#4b5563", "#65a30d", "#7c3aed", "#0d9488"];

/** TensorBoard-style exponential moving average, debiased so the first points are not pulled to zero. */
export function ema(values, weight) {
  if (!weight) return values;
  let acc = 0;
  let n = 0;
  return values.map((v) => {
    if (v === null || v === undefined || !Number.isFinite(v)) return null;
    n += 1;
    acc = acc * weight + (1 - weight) * v;
    return acc / (1 - weight ** n);
  });
}

/**
 * records → {x, cols}: x the sorted union of the x values (step, or seconds since the first record), cols[key] the
 * value of `key` at each x (null where a record did not have it). Train and eval records of one step share an x.
 */
export function align(records, keys, axis) {
  const t0 = records.length ? Math.min(...records.map((r) => r.time ?? Infinity)) : 0;
  const rows = new Map();
  for (const r of records) {
    const x = axis === "time" ? (r.time ?? t0) - t0 : r.step;
    if (x === undefined || x === null) continue;
    let row = rows.get(x);
    if (!row) rows.set(x, (row = {}));
    for (const k of keys) if (typeof r[k] === "number" && Number.isFinite(r[k])) row[k] = r[k];
  }
  const x = [...rows.keys()].sort((a, b) => a - b);
  const cols = {};
  for (const k of keys) cols[k] = x.map((xi) => rows.get(xi)[k] ?? null);
  return { x, cols };
}

export const countPoints = (values) => values.filter((v) => v !== null && v !== undefined).length;

/** A titled chart in its own box; `update` redraws with new data, rebuilding only when the series change. */
export class Chart {
  constructor(parent, { id, title, xLabel = "step", height = 200 }) {
    this.id = id;
    this.title = title;
    this.xLabel = xLabel;
    this.height = height;
    this.plot = null;
    this.signature = "";
    this.box = h("div", { class: "chart", id: `chart-${id}`, dataset: { testid: `${id}-chart`, points: "0" } });
    this.body = h("div", { class: "chart-body" });
    this.box.append(h("div", { class: "chart-title" }, title), this.body);
    parent.append(this.box);
    const ro = new ResizeObserver(() => {
      if (this.plot) this.plot.setSize({ width: this.width(), height: this.height });
    });
    ro.observe(this.box);
    life.onLeave(() => { ro.disconnect(); this.destroy(); });
  }

  width() {
    return Math.max(240, (this.box.clientWidth || 400) - 16);
  }

  /**
   * series: [{label, values, color, points (bool: eval-style dots), dash, faint}] aligned with x.
   * `count` goes to data-points so tests and people can see how many points the main series holds.
   */
  update(x, series, count) {
    this.box.dataset.points = String(count ?? 0);
    const data = [x, ...series.map((s) => s.values)];
    const signature = `${this.xLabel}|` + series.map((s) => `${s.label}:${s.color}:${!!s.faint}`).join(",");
    if (this.plot && signature === this.signature) {
      this.plot.setData(data);
      return;
    }
    this.destroy();
    this.signature = signature;
    this.body.textContent = "";
    if (!x.length) {
      this.body.append(h("p", { class: "muted empty" }, "no points yet"));
      return;
    }
    const opts = {
      width: this.width(),
      height: this.height,
      scales: { x: { time: false } },
      legend: { live: true },
      cursor: { drag: { x: true, y: false } },
      axes: [{ label: this.xLabel, labelSize: 18, size: 36 }, { size: 56 }],
      series: [
        { label: this.xLabel },
        ...series.map((s) => ({
          label: s.label,
          stroke: s.faint ? hexAlpha(s.color, 0.25) : s.color,
          width: s.faint ? 1 : 1.75,
          dash: s.dash,
          spanGaps: true,
          points: s.points ? { show: true, size: 7, fill: s.color } : { show: (u) => u.data[0].length < 60 },
        })),
      ],
    };
    this.plot = new uPlot(opts, data, this.body);
  }

  destroy() {
    if (this.plot) this.plot.destroy();
    this.plot = null;
    this.signature = "";
  }
}

function hexAlpha(hex, a) {
  const n = parseInt(hex.slice(1), 16);
  return `rgba(${(n >> 16) & 255}, ${(n >> 8) & 255}, ${n & 255}, ${a})`;
}

/** Turn a series spec into drawn series, adding the faint raw line behind a smoothed one. */
export function withSmoothing(specs, smoothing) {
  const out = [];
  for (const s of specs) {
    if (smoothing > 0 && !s.points) {
      out.push({ ...s, label: `${s.label} (raw)`, faint: true });
      out.push({ ...s, values: ema(s.values, smoothing) });
    } else {
      out.push(s);
    }
  }
  return out;
}
