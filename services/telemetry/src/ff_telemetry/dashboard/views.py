"""What the dashboard's JSON API answers, made from the services' messages (pure: no I/O)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from fireflyer.common.v1 import common_pb2
from fireflyer.mgmtd.v1 import mgmtd_pb2
from fireflyer.scheduler.v1 import scheduler_pb2 as spb
from fireflyer.telemetry.v1 import telemetry_pb2 as tpb

Json = dict[str, Any]

# The tasks page's groups, by task state.
TASK_GROUPS: dict[str, tuple[int, ...]] = {
    "queued": (spb.TASK_STATE_QUEUED,),
    "running": (spb.TASK_STATE_RUNNING,),
    "suspended": (spb.TASK_STATE_SUSPENDED,),
    "history": (spb.TASK_STATE_SUCCEEDED, spb.TASK_STATE_FAILED, spb.TASK_STATE_STOPPED),
}
QUEUE_REASONS = {
    spb.QUEUE_REASON_UNSPECIFIED: "",
    spb.QUEUE_REASON_WAITING_FOR_NODES: "waiting for free nodes",
    spb.QUEUE_REASON_OUT_OF_QUOTA: "the user's other tasks use the quota",
    spb.QUEUE_REASON_QUOTA_EXCEEDED: "needs more nodes than the quota allows: it cannot run at this priority",
}
SUSPEND_ENDS = (spb.RUN_END_REASON_PREEMPTED, spb.RUN_END_REASON_SUSPENDED_BY_USER)


def word(enum_name: str, prefix: str) -> str:
    """``TASK_STATE_QUEUED`` -> ``queued``."""
    return enum_name.removeprefix(prefix).lower()


def _task_state(value: int) -> str:
    """A TaskState as a word (``queued``)."""
    return word(spb.TaskState.Name(value), "TASK_STATE_")  # type: ignore[arg-type]


def _run_state(value: int) -> str:
    """A RunState as a word (``running``)."""
    return word(spb.RunState.Name(value), "RUN_STATE_")  # type: ignore[arg-type]


def _end_reason(value: int) -> str:
    """A RunEndReason as a word; "" for none."""
    return "" if not value else word(spb.RunEndReason.Name(value), "RUN_END_REASON_")  # type: ignore[arg-type]


def _task_summary(t: spb.Task) -> Json:
    """A task as the tasks page lists it."""
    return {
        "task_id": str(t.task_id),
        "name": t.spec.name,
        "user": t.user_name,
        "state": _task_state(t.state),
        "priority": t.priority,
        "num_nodes": t.spec.num_nodes,
        "node_group": t.node_group,
        "waiting_because": QUEUE_REASONS.get(t.queue_reason, "")
        if t.state in (spb.TASK_STATE_QUEUED, spb.TASK_STATE_SUSPENDED)
        else "",
        "num_runs": t.num_runs,
        "created_at": t.created_at,
        "started_at": t.current_run.started_at,
        "finished_at": t.finished_at,
        "end_reason": _end_reason(t.end_reason),
        "end_message": t.end_message,
    }


def task_groups(tasks: Iterable[spb.Task]) -> Json:
    """Tasks by the tasks page's groups; the queue in the order it is served (oldest first)."""
    groups: dict[str, list[Json]] = {name: [] for name in TASK_GROUPS}
    for t in tasks:
        for name, states in TASK_GROUPS.items():
            if t.state in states:
                groups[name].append(_task_summary(t))
    for name in ("queued", "suspended"):
        groups[name].sort(key=lambda t: (-t["priority"], t["created_at"]))
    return groups


def _run_view(r: spb.Run) -> Json:
    """A run as the task page shows it."""
    return {
        "run_id": str(r.run_id),
        "index": r.run_index,
        "state": _run_state(r.state),
        "priority": r.priority,
        "nodes": [{"node_id": n.node_id, "hostname": n.hostname, "node_rank": n.node_rank} for n in r.nodes],
        "created_at": r.created_at,
        "started_at": r.started_at,
        "ended_at": r.ended_at,
        "suspend_requested_at": r.suspend_requested_at,
        "end_reason": _end_reason(r.end_reason),
        "end_message": r.end_message,
        "failure": r.failure.message if r.HasField("failure") else "",
    }


def task_detail(t: spb.Task) -> Json:
    """The task page: the task, its runs, the ranks of its latest run, its suspends and checkpoints."""
    runs = list(t.runs) or ([t.current_run] if t.HasField("current_run") else [])
    current = runs[-1] if runs else None
    ranks_per_node = t.spec.ranks_per_node
    return {
        **_task_summary(t),
        "argv": list(t.spec.argv),
        "ranks_per_node": ranks_per_node,
        "runs": [_run_view(r) for r in runs],
        "nodes": [] if current is None else _run_view(current)["nodes"],
        "suspends": [
            {
                "run_id": str(r.run_id),
                "requested_at": r.suspend_requested_at,
                "ended_at": r.ended_at,
                "reason": _end_reason(r.end_reason),
                "state": _run_state(r.state),
            }
            for r in runs
            if r.suspend_requested_at or r.end_reason in SUSPEND_ENDS
        ],
        "checkpoints": [
            {
                "run_id": str(r.run_id),
                "path": r.last_checkpoint.path,
                "step": r.last_checkpoint.step,
                "committed_at": r.last_checkpoint.committed_at,
            }
            for r in runs
            if r.last_checkpoint.committed_at
        ],
    }


def _node_type(value: int) -> str:
    return word(common_pb2.NodeType.Name(value), "NODE_TYPE_")  # type: ignore[arg-type]


def _target_state(value: int) -> str:
    return word(mgmtd_pb2.PublicTargetState.Name(value), "PUBLIC_TARGET_STATE_")  # type: ignore[arg-type]


def overview(routing: mgmtd_pb2.RoutingInfo, nodes: Sequence[spb.Node] | None, storage: Json) -> Json:
    """Services by type and liveness, compute nodes by state, devices busy, chains and targets by state."""
    services: Counter[tuple[str, str]] = Counter(
        (_node_type(n.node_type), "alive" if n.status == mgmtd_pb2.NODE_STATUS_ALIVE else "dead") for n in routing.nodes
    )
    targets = Counter(_target_state(t.public_state) for c in routing.chains for t in c.targets)
    chains = Counter(
        "serving"
        if any(t.public_state == mgmtd_pb2.PUBLIC_TARGET_STATE_SERVING for t in c.targets)
        else "no serving target"
        for c in routing.chains
    )
    out: Json = {
        "services": [{"type": k[0], "status": k[1], "count": v} for k, v in sorted(services.items())],
        "chains": dict(sorted(chains.items())),
        "targets": dict(sorted(targets.items())),
        "storage": storage,
        "compute": None,
    }
    if nodes is not None:
        out["compute"] = {
            "nodes": dict(sorted(Counter(word(spb.NodeState.Name(n.state), "NODE_STATE_") for n in nodes).items())),
            "num_devices": sum(len(n.devices) for n in nodes),
            # Whole nodes are the unit of scheduling: a node with a task has all its devices busy.
            "num_devices_busy": sum(len(n.devices) for n in nodes if n.task_ids),
            "list": [
                {
                    "node_id": n.node_id,
                    "hostname": n.hostname,
                    "group": n.node_group,
                    "state": word(spb.NodeState.Name(n.state), "NODE_STATE_"),
                    "reason": n.state_reason,
                    "num_devices": len(n.devices),
                    "tasks": [str(i) for i in n.task_ids],
                }
                for n in nodes
            ],
        }
    return out


def alert_view(a: tpb.Alert) -> Json:
    """An alert as the alerts page shows it."""
    return {
        "alert_id": str(a.alert_id),
        "rule": a.rule,
        "kind": a.kind,
        "severity": a.severity,
        "state": word(tpb.AlertState.Name(a.state), "ALERT_STATE_"),
        "labels": dict(sorted(a.labels.items())),
        "summary": a.summary,
        "fired_at": a.fired_at,
        "resolved_at": a.resolved_at,
    }
