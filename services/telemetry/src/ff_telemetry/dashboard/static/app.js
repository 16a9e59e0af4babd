// Shared helpers of the dashboard's pages. Everything from the API is put in the page with textContent
// (never innerHTML): task names, log lines and labels are the users' own strings.
"use strict";

const ff = {
  async api(path) {
    const resp = await fetch(path, { credentials: "same-origin", headers: { Accept: "application/json" } });
    if (resp.status === 401) {
      location.href = "/login?next=" + encodeURIComponent(location.pathname);
      throw new Error("logged out");
    }
    const body = await resp.json().catch(() => ({}));
    if (!resp.ok) throw new Error(body.error || resp.status + " " + resp.statusText);
    return body;
  },

  el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") node.className = v;
      else node.setAttribute(k, v);
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  },

  clear(node) {
    while (node.firstChild) node.removeChild(node.firstChild);
    return node;
  },

  // rows: objects; columns: [title, row => text or Node]
  table(columns, rows, empty) {
    if (!rows.length) return ff.el("p", { class: "empty" }, empty || "none");
    const head = ff.el("tr", {}, ...columns.map(([title]) => ff.el("th", {}, title)));
    const body = rows.map((row) => ff.el("tr", {}, ...columns.map(([, cell]) => ff.el("td", {}, cell(row)))));
    return ff.el("table", {}, ff.el("thead", {}, head), ff.el("tbody", {}, ...body));
  },

  counts(obj) {
    const entries = Object.entries(obj || {});
    if (!entries.length) return ff.el("p", { class: "empty" }, "none");
    return ff.el("ul", { class: "counts" }, ...entries.map(([k, v]) =>
      ff.el("li", { class: "state-" + k.replace(/[^a-z]/g, "-") }, ff.el("b", {}, String(v)), " " + k)));
  },

  time(ts) {
    return ts ? new Date(ts * 1000).toLocaleString() : "";
  },

  bytes(n) {
    if (n === null || n === undefined) return "";
    const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let i = 0;
    while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return n.toFixed(i ? 1 : 0) + " " + units[i];
  },

  num(v) {
    if (v === null || v === undefined) return "";
    return Math.abs(v) >= 1000 || Math.abs(v) < 0.01 ? Number(v).toPrecision(3) : String(+Number(v).toFixed(4));
  },

  taskLink(task) {
    return ff.el("a", { href: "/tasks/" + encodeURIComponent(task.task_id) }, task.name || "#" + task.task_id);
  },

  error(message) {
    const box = document.getElementById("error");
    if (box) box.textContent = message || "";
  },

  // Calls fn now and every ms milliseconds; failures show in the error line and polling goes on.
  poll(fn, ms) {
    const tick = async () => {
      try { await fn(); ff.error(""); } catch (e) { ff.error(String(e.message || e)); }
      setTimeout(tick, ms);
    };
    tick();
  },
};

// The page's own entry in the menu (a task's page is under Tasks).
(() => {
  const page = document.body.dataset.page === "task" ? "tasks" : document.body.dataset.page;
  const link = document.querySelector(`header nav a[data-nav="${page}"]`);
  if (link) link.classList.add("here");
})();
