// Storage: throughput and latency over the last 15 minutes, and each target's latest figures.
"use strict";

function curves(chart, label) {
  return (chart || []).map((s) => ({ name: label, points: s.points }));
}

function draw(id, series, yFormat) {
  ff.lineChart(document.getElementById(id + "-chart"), series, { xFormat: (x) => new Date(x * 1000).toLocaleTimeString(), yFormat });
  ff.legend(document.getElementById(id + "-legend"), series);
}

async function refresh() {
  const s = await ff.api("/api/storage?window_s=900");
  draw("throughput", [...curves(s.charts.read_bytes_per_s, "read"), ...curves(s.charts.write_bytes_per_s, "write")],
    (v) => ff.bytes(v) + "/s");
  draw("latency", [...curves(s.charts.read_p99_s, "read p99"), ...curves(s.charts.write_p99_s, "write p99")], ff.num);
  ff.clear(document.getElementById("targets")).append(ff.table([
    ["target", (t) => t.target_id], ["chain", (t) => t.chain_id], ["capacity", (t) => ff.bytes(t.capacity_bytes)],
    ["free", (t) => ff.bytes(t.free_bytes)], ["stored", (t) => ff.bytes(t.stored_bytes)], ["chunks", (t) => t.chunks],
    ["read p50 / p99 s", (t) => `${ff.num(t.read_latency_seconds_p50)} / ${ff.num(t.read_latency_seconds_p99)}`],
    ["write p50 / p99 s", (t) => `${ff.num(t.write_latency_seconds_p50)} / ${ff.num(t.write_latency_seconds_p99)}`],
  ], s.targets, "no storage target has reported"));
}

ff.poll(refresh, 5000);
