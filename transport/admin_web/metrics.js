// The numbers of /metrics (Prometheus text format) as small live charts, drawn as inline SVG.

import { el, fill } from "./dom.js";

const SVG = "http://www.w3.org/2000/svg";
const POINTS = 60;

/** Sum of every sample of each metric name, labels aside (`_created` samples skipped). */
export function parse(text) {
  const sums = new Map();
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const match = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)/.exec(line);
    if (!match || match[1].endsWith("_created")) continue;
    const value = Number(match[3]);
    if (Number.isFinite(value)) sums.set(match[1], (sums.get(match[1]) || 0) + value);
  }
  return sums;
}

// Each chart: its title, and its value from two successive scrapes `dt` seconds apart.
const gauge = (name) => (now) => now.get(name);
const rate = (name) => (now, before, dt) =>
  before && dt > 0 ? Math.max(0, (now.get(name) - before.get(name)) / dt) : undefined;
const mean = (name, scale) => (now, before) => {
  if (!before) return undefined;
  const count = now.get(`${name}_count`) - before.get(`${name}_count`);
  return count > 0 ? ((now.get(`${name}_sum`) - before.get(`${name}_sum`)) / count) * scale : 0;
};

export const CHARTS = [
  { title: "Live actors", value: gauge("stillhere_live_actors"), digits: 0 },
  { title: "Links", value: gauge("stillhere_links"), digits: 0 },
  { title: "Hellos per second", value: rate("stillhere_hellos_total"), digits: 1 },
  { title: "Turns per second", value: rate("stillhere_turn_seconds_count"), digits: 1 },
  { title: "Mean turn, s", value: mean("stillhere_turn_seconds", 1), digits: 2 },
  { title: "Mean loop lag, ms", value: mean("stillhere_loop_lag_seconds", 1000), digits: 1 },
  { title: "Archives per second", value: rate("stillhere_archives_total"), digits: 2 },
  { title: "GC pauses per second", value: rate("stillhere_gc_pause_seconds_count"), digits: 1 },
];

/** The charts of one page: fed a scrape at a time, each keeps its last POINTS values. */
export class Charts {
  constructor(root) {
    this.before = null;
    this.at = 0;
    this.charts = CHARTS.map((spec) => this.#make(spec));
    fill(root, this.charts.map((c) => c.figure));
  }

  #make(spec) {
    const value = el("span", { class: "value", text: "–" });
    const svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("viewBox", `0 0 ${POINTS - 1} 100`);
    svg.setAttribute("preserveAspectRatio", "none");
    svg.setAttribute("aria-hidden", "true");
    const line = document.createElementNS(SVG, "polyline");
    svg.append(line);
    const caption = el("figcaption", {}, el("span", { text: spec.title }), value);
    const figure = el("figure", { class: "chart", "aria-label": spec.title }, caption, svg);
    return { spec, figure, value, line, points: [] };
  }

  /** One scrape of /metrics, at `now` (ms). */
  add(text, now) {
    const sums = parse(text);
    const dt = this.before ? (now - this.at) / 1000 : 0;
    for (const chart of this.charts) {
      const value = chart.spec.value(sums, this.before, dt);
      if (value === undefined || Number.isNaN(value)) continue;
      chart.points.push(value);
      if (chart.points.length > POINTS) chart.points.shift();
      chart.value.textContent = value.toFixed(chart.spec.digits);
      chart.figure.setAttribute("aria-label", `${chart.spec.title}: ${chart.value.textContent}`);
      draw(chart);
    }
    this.before = sums;
    this.at = now;
  }
}

function draw(chart) {
  const top = Math.max(...chart.points, 1e-9);
  const offset = POINTS - chart.points.length;
  const points = chart.points.map((v, i) => `${offset + i},${(100 - (v / top) * 96 - 2).toFixed(1)}`);
  chart.line.setAttribute("points", points.join(" "));
}
