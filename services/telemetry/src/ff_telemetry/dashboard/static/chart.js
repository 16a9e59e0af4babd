// A small SVG line chart: ff.lineChart(svg, [{name, points: [[x, y], ...]}], {xLabel, yLabel, yFormat}).
// Each curve is a <path class="curve"> whose data-values holds the points it draws (null y = a gap).
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";
const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777"];

function svgEl(tag, attrs, text) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

ff.lineChart = function (svg, series, opts) {
  opts = opts || {};
  const W = 640, H = 240, L = 60, R = 12, T = 12, B = 34;
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  while (svg.firstChild) svg.removeChild(svg.firstChild);
  const all = series.flatMap((s) => s.points.filter((p) => p[1] !== null && p[0] !== null));
  if (!all.length) {
    svg.append(svgEl("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "nodata" }, "no data yet"));
    return;
  }
  let [x0, x1] = [Math.min(...all.map((p) => p[0])), Math.max(...all.map((p) => p[0]))];
  let [y0, y1] = [Math.min(...all.map((p) => p[1])), Math.max(...all.map((p) => p[1]))];
  if (x0 === x1) { x0 -= 1; x1 += 1; }
  if (y0 === y1) { y0 -= Math.abs(y0) * 0.1 || 1; y1 += Math.abs(y1) * 0.1 || 1; }
  const sx = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
  const sy = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  const fmtY = opts.yFormat || ff.num;
  const fmtX = opts.xFormat || ff.num;
  const axes = svgEl("g", { class: "axes" });
  axes.append(svgEl("line", { x1: L, y1: H - B, x2: W - R, y2: H - B }));
  axes.append(svgEl("line", { x1: L, y1: T, x2: L, y2: H - B }));
  for (let i = 0; i <= 4; i++) {
    const y = y0 + ((y1 - y0) * i) / 4, x = x0 + ((x1 - x0) * i) / 4;
    axes.append(svgEl("line", { x1: L, y1: sy(y), x2: W - R, y2: sy(y), class: "grid" }));
    axes.append(svgEl("text", { x: L - 4, y: sy(y) + 4, "text-anchor": "end" }, fmtY(y)));
    axes.append(svgEl("text", { x: sx(x), y: H - B + 14, "text-anchor": "middle" }, fmtX(x)));
  }
  if (opts.xLabel) axes.append(svgEl("text", { x: W - R, y: H - 4, "text-anchor": "end", class: "label" }, opts.xLabel));
  svg.append(axes);
  series.forEach((s, i) => {
    const drawn = s.points.filter((p) => p[0] !== null);
    const segments = [[]];
    for (const p of drawn) {
      if (p[1] === null) segments.push([]);
      else segments[segments.length - 1].push(`${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`);
    }
    const color = COLORS[i % COLORS.length];
    const line = svgEl("path", {
      class: "curve", stroke: color, "data-name": s.name,
      d: segments.filter((seg) => seg.length).map((seg) => "M" + seg.join(" L")).join(" "),
    });
    line.dataset.values = JSON.stringify(drawn.map((p) => [p[0], p[1]]));
    line.append(svgEl("title", {}, s.name));
    svg.append(line);
    if (drawn.length === 1 && drawn[0][1] !== null) {
      svg.append(svgEl("circle", { cx: sx(drawn[0][0]), cy: sy(drawn[0][1]), r: 3, fill: color }));
    }
  });
};

// The legend under a chart: one coloured name per curve.
ff.legend = function (box, series) {
  ff.clear(box);
  series.forEach((s, i) => {
    const swatch = ff.el("span", { class: "swatch swatch-" + (i % COLORS.length) });
    box.append(ff.el("span", { class: "legend-item" }, swatch, s.name));
  });
};
