// Alerts: the alert log, firing first.
"use strict";

const stateBox = document.getElementById("state");

async function refresh() {
  const body = await ff.api("/api/alerts?state=" + encodeURIComponent(stateBox.value));
  const box = ff.clear(document.getElementById("alerts"));
  if (!body.enabled) {
    box.append(ff.el("p", { class: "empty" }, "this telemetry instance evaluates no alerts"));
    return;
  }
  const rows = body.alerts.slice().sort((a, b) => (a.state === b.state ? b.fired_at - a.fired_at : a.state === "firing" ? -1 : 1));
  box.append(ff.table([
    ["state", (a) => a.state], ["severity", (a) => ff.el("span", { class: "sev-" + a.severity }, a.severity)],
    ["rule", (a) => a.rule], ["summary", (a) => a.summary],
    ["labels", (a) => Object.entries(a.labels).map(([k, v]) => `${k}=${v}`).join(" ")],
    ["fired", (a) => ff.time(a.fired_at)], ["resolved", (a) => ff.time(a.resolved_at)],
  ], rows, "no alerts"));
}

stateBox.addEventListener("change", () => refresh().catch((e) => ff.error(String(e.message || e))));
ff.poll(refresh, 5000);
