// Tasks: the queue (with why each waits), running, suspended, history.
"use strict";

const COMMON = [
  ["task", (t) => ff.taskLink(t)], ["id", (t) => t.task_id], ["user", (t) => t.user],
  ["priority", (t) => t.priority], ["nodes", (t) => t.num_nodes],
];

const GROUPS = {
  queued: [...COMMON, ["waiting because", (t) => t.waiting_because], ["submitted", (t) => ff.time(t.created_at)]],
  running: [...COMMON, ["runs", (t) => t.num_runs], ["started", (t) => ff.time(t.started_at)]],
  suspended: [...COMMON, ["runs", (t) => t.num_runs], ["waiting because", (t) => t.waiting_because]],
  history: [...COMMON, ["state", (t) => t.state], ["finished", (t) => ff.time(t.finished_at)],
    ["why", (t) => t.end_message || t.end_reason]],
};

async function refresh() {
  const groups = await ff.api("/api/tasks");
  for (const [name, columns] of Object.entries(GROUPS)) {
    ff.clear(document.getElementById(name)).append(ff.table(columns, groups[name] || [], "no tasks"));
  }
}

ff.poll(refresh, 3000);
