// A task's page: its facts, ranks, loss and throughput curves (polled every 1.5 s), the tail of a rank's log,
// its suspends, checkpoints and runs.
"use strict";

const taskId = decodeURIComponent(location.pathname.split("/").pop());
const api = "/api/tasks/" + encodeURIComponent(taskId);
const $ = (id) => document.getElementById(id);
let latest = {}; // rank label -> [step, value] of the last loss point, for the ranks table
let task = null;

function seriesName(labels) {
  const parts = [];
  if (labels.rank !== undefined) parts.push("rank " + labels.rank);
  if (labels.run_id !== undefined) parts.push("run " + labels.run_id);
  return parts.join(", ") || "task";
}

// [step, value, at] -> [x, y]: x is the step the value was reported with (its index when none was)
function curve(s) {
  return { name: seriesName(s.labels), labels: s.labels, points: s.points.map((p, i) => [p[0] === null ? i : p[0], p[1]]) };
}

async function drawCurve(metric, id) {
  const body = await ff.api(`${api}/series?metric=${metric}`);
  const series = body.series.map(curve);
  ff.lineChart($(id + "-chart"), series, { xLabel: "step" });
  ff.legend($(id + "-legend"), series);
  return series;
}

async function refreshCurves() {
  const loss = await drawCurve("loss", "loss");
  await drawCurve("tokens_per_s", "throughput");
  latest = {};
  for (const s of loss) {
    const last = s.points[s.points.length - 1];
    if (last) latest[`${s.labels.node_rank ?? ""}/${s.labels.local_rank ?? s.labels.rank ?? ""}`] = { rank: s.labels.rank, last };
  }
  drawRanks();
}

function fact(name, value) {
  return [ff.el("dt", {}, name), ff.el("dd", {}, value)];
}

function drawRanks() {
  if (!task) return;
  const perNode = task.ranks_per_node;
  const rows = [];
  for (const n of task.nodes) {
    const known = Object.entries(latest).filter(([k]) => k.split("/")[0] === String(n.node_rank));
    if (known.length) {
      for (const [k, v] of known) rows.push({ node: n, local: k.split("/")[1], rank: v.rank, last: v.last });
    } else {
      rows.push({ node: n, local: perNode ? `0..${perNode - 1}` : "", rank: "", last: null });
    }
  }
  ff.clear($("ranks")).append(ff.table([
    ["node rank", (r) => r.node.node_rank], ["host", (r) => r.node.hostname], ["local rank", (r) => r.local],
    ["rank", (r) => r.rank ?? ""], ["last step", (r) => (r.last ? r.last[0] : "")], ["last loss", (r) => (r.last ? ff.num(r.last[1]) : "")],
  ], rows, "no run yet"));
}

function options(select, values) {
  const keep = select.value;
  ff.clear(select).append(...values.map((v) => ff.el("option", { value: String(v) }, String(v))));
  if (values.map(String).includes(keep)) select.value = keep;
}

async function refreshTask() {
  task = await ff.api(api);
  document.title = `${task.name} · Fire-Flyer`;
  $("title").textContent = `Task ${task.task_id}: ${task.name}`;
  ff.clear($("facts")).append(
    ...fact("user", task.user), ...fact("state", task.state), ...fact("priority", task.priority),
    ...fact("nodes", task.num_nodes), ...fact("group", task.node_group), ...fact("command", task.argv.join(" ")),
    ...fact("waiting because", task.waiting_because || "-"), ...fact("submitted", ff.time(task.created_at)),
    ...fact("finished", ff.time(task.finished_at) || "-"), ...fact("why", task.end_message || task.end_reason || "-"),
  );
  options($("node-rank"), task.nodes.length ? task.nodes.map((n) => n.node_rank) : [0]);
  options($("local-rank"), [...Array(Math.max(task.ranks_per_node, 1)).keys()]);
  ff.clear($("suspends")).append(ff.table([
    ["run", (s) => s.run_id], ["asked", (s) => ff.time(s.requested_at)], ["ended", (s) => ff.time(s.ended_at)],
    ["why", (s) => s.reason || s.state],
  ], task.suspends, "never suspended"));
  ff.clear($("checkpoints")).append(ff.table([
    ["run", (c) => c.run_id], ["step", (c) => c.step], ["path", (c) => c.path], ["committed", (c) => ff.time(c.committed_at)],
  ], task.checkpoints, "no checkpoint reported"));
  ff.clear($("runs")).append(ff.table([
    ["run", (r) => r.run_id], ["#", (r) => r.index], ["state", (r) => r.state], ["priority", (r) => r.priority],
    ["nodes", (r) => r.nodes.map((n) => n.hostname || n.node_id).join(", ")], ["started", (r) => ff.time(r.started_at)],
    ["ended", (r) => ff.time(r.ended_at)], ["why", (r) => r.failure || r.end_message || r.end_reason],
  ], task.runs, "no run yet"));
  drawRanks();
}

async function refreshLog() {
  const q = `node_rank=${encodeURIComponent($("node-rank").value || 0)}&local_rank=${encodeURIComponent($("local-rank").value || 0)}`;
  const body = await ff.api(`${api}/log?${q}&tail_bytes=16384`);
  const box = $("log");
  const atEnd = box.scrollTop + box.clientHeight >= box.scrollHeight - 4;
  box.textContent = body.text;
  $("log-note").textContent = body.note;
  if (atEnd) box.scrollTop = box.scrollHeight;
}

ff.poll(refreshTask, 5000);
ff.poll(refreshCurves, 1500);
ff.poll(refreshLog, 5000);
