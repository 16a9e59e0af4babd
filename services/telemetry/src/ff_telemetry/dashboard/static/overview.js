// Cluster overview: nodes by state, devices busy, storage capacity, chains and targets by state.
"use strict";

function fill(id, node) {
  ff.clear(document.getElementById(id)).append(node);
}

function ratio(barId, used, total) {
  document.getElementById(barId).style.width = total ? Math.round((100 * used) / total) + "%" : "0";
}

async function refresh() {
  const o = await ff.api("/api/overview");
  const c = o.compute;
  fill("compute-nodes", c ? ff.counts(c.nodes) : ff.el("p", { class: "empty" }, "the scheduler is not reachable"));
  document.getElementById("devices").textContent = c ? `${c.num_devices_busy} / ${c.num_devices}` : "?";
  ratio("devices-bar", c ? c.num_devices_busy : 0, c ? c.num_devices : 0);
  const s = o.storage;
  const used = s.capacity_bytes - s.free_bytes;
  document.getElementById("capacity").textContent = `${ff.bytes(used)} / ${ff.bytes(s.capacity_bytes)}`;
  document.getElementById("capacity-note").textContent = `used of ${s.num_targets} targets' disks`;
  ratio("capacity-bar", used, s.capacity_bytes);
  fill("chains", ff.counts(o.chains));
  fill("targets", ff.counts(o.targets));
  fill("services", ff.table([["type", (r) => r.type], ["status", (r) => r.status], ["count", (r) => r.count]], o.services));
  fill("nodes", ff.table([
    ["node", (n) => n.node_id], ["host", (n) => n.hostname], ["group", (n) => n.group], ["state", (n) => n.state],
    ["devices", (n) => n.num_devices], ["tasks", (n) => n.tasks.join(", ")], ["reason", (n) => n.reason],
  ], c ? c.list : [], "no compute nodes registered"));
}

ff.poll(refresh, 5000);
