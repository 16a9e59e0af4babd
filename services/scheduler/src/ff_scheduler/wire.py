"""Protobuf <-> the scheduler's rows and domain types (no decisions here)."""

from __future__ import annotations

from typing import Any

from ff_scheduler.core import priority
from ff_scheduler.core.model import Failure, FailureClass, NodePhase
from ff_scheduler.core.validation import TaskRequest
from ff_scheduler.store.ops import NodeRunFacts, TaskView
from ff_scheduler.store.ticks import node_state
from fireflyer.scheduler.v1 import scheduler_pb2 as pb

AUTO = -1


def task_request(spec: pb.TaskSpec) -> TaskRequest:
    """A submission as ``core.validation.check_task`` takes it."""
    return TaskRequest(
        name=spec.name,
        argv=list(spec.argv),
        env=dict(spec.env),
        working_dir=spec.working_dir,
        num_nodes=spec.num_nodes,
        priority=spec.priority if spec.HasField("priority") else None,
        auto_priority=spec.auto_priority,
        node_group=spec.node_group,
        ranks_per_node=spec.ranks_per_node,
        watchdog_time_s=spec.watchdog_time_s,
        max_restarts=spec.max_restarts if spec.HasField("max_restarts") else None,
        suspend_grace_s=spec.suspend_grace_s,
        image=spec.image,
        whole_life_state=spec.whole_life_state,
        tags=dict(spec.tags),
    )


def _failure_pb(data: dict[str, Any] | None) -> pb.RunFailure | None:
    """A stored failure (see ``store.ticks.failure_to_json``); keys of a newer version are ignored."""
    if not data:
        return None
    return pb.RunFailure(**{k: v for k, v in data.items() if k in pb.RunFailure.DESCRIPTOR.fields_by_name})


def run_to_proto(run: Any, nodes_of_run: list[Any] | None = None) -> pb.Run:
    """A run row for the wire, with its nodes' hostnames when their rows are given."""
    msg = pb.Run(
        run_id=run.run_id,
        task_id=run.task_id,
        run_index=run.run_index,
        state=run.state,
        priority=run.priority,
        master_address=run.master_address,
        suspend_stage=run.suspend_stage,
        start_whole_life_state=run.start_whole_life_state,
        created_at=run.created_at,
        started_at=run.started_at,
        suspend_requested_at=run.suspend_requested_at,
        ended_at=run.ended_at,
        end_reason=run.end_reason,
        end_message=run.end_message,
        nodes=[pb.AssignedNode(node_id=n, node_rank=rank) for rank, n in enumerate(run.node_ids)],
    )
    failure = _failure_pb(run.failure)
    if failure is not None:
        msg.failure.CopyFrom(failure)
    if run.checkpoint:
        msg.last_checkpoint.CopyFrom(pb.Checkpoint(**run.checkpoint))
    return msg


def task_to_proto(view: TaskView) -> pb.Task:
    """A task (and its runs, when the view has them) for the wire; AUTO priority as ``AUTO``."""
    t = view.task
    spec = t.spec
    msg = pb.Task(
        task_id=t.task_id,
        user_name=t.user_name,
        uid=t.uid,
        state=t.state,
        priority=AUTO if t.priority is None else t.priority,
        node_group=t.node_group,
        queue_reason=t.queue_reason,
        whole_life_state=t.whole_life_state,
        num_runs=t.num_runs,
        num_restarts=t.num_restarts,
        created_at=t.created_at,
        first_started_at=t.first_started_at,
        finished_at=t.finished_at,
        end_reason=t.end_reason,
        end_message=t.end_message,
        spec=pb.TaskSpec(
            name=t.name,
            argv=spec["argv"],
            env=spec.get("env", {}),
            working_dir=spec.get("working_dir", ""),
            num_nodes=t.num_nodes,
            auto_priority=t.asked_priority is None,
            node_group=t.node_group,
            ranks_per_node=spec.get("ranks_per_node", 0),
            watchdog_time_s=t.watchdog_time_s,
            max_restarts=t.max_restarts,
            suspend_grace_s=t.suspend_grace_s,
            image=spec.get("image", ""),
            tags=spec.get("tags", {}),
        ),
    )
    if t.asked_priority is not None:
        msg.spec.priority = t.asked_priority
    if view.run is not None:
        msg.current_run.CopyFrom(run_to_proto(view.run))
    msg.runs.extend(run_to_proto(r) for r in view.runs)
    return msg


def node_to_proto(row: Any, task_ids: list[int]) -> pb.Node:
    """A node row for the wire, with its state and the tasks on it."""
    msg = pb.Node(
        node_id=row.node_id,
        hostname=row.hostname,
        node_group=row.node_group,
        zone=row.zone,
        devices=[pb.Device(**d) for d in row.devices or []],
        num_cpus=row.num_cpus,
        memory_bytes=row.memory_bytes,
        state=pb.NodeState.ValueType(node_state(row)),
        state_reason=row.disabled_reason or row.err_reason or ("" if row.online else "offline"),
        task_ids=task_ids,
        registered_at=row.registered_at,
        last_report_at=row.last_report_at,
    )
    if row.validation:
        msg.last_validation.CopyFrom(_validation_from_json(row.validation))
    return msg


def validation_to_json(v: pb.Validation) -> dict[str, Any]:
    """A node validation as stored in a JSON column."""
    return {
        "finished_at": v.finished_at,
        "passed": v.passed,
        "checks": [
            {
                "name": c.name,
                "passed": c.passed,
                "value": c.value,
                "threshold": c.threshold,
                "unit": c.unit,
                "message": c.message,
                "duration_s": c.duration_s,
            }
            for c in v.checks
        ],
    }


def _validation_from_json(data: dict[str, Any]) -> pb.Validation:
    """A stored validation for the wire."""
    return pb.Validation(
        finished_at=data.get("finished_at", 0.0),
        passed=data.get("passed", False),
        checks=[pb.CheckResult(**c) for c in data.get("checks", [])],
    )


def device_to_json(d: pb.Device) -> dict[str, Any]:
    """A device as stored in a node row's JSON column."""
    return {"index": d.index, "kind": d.kind, "name": d.name, "memory_bytes": d.memory_bytes}


def quota_to_proto(row: Any, used: int) -> pb.Quota:
    """A quota row with the nodes its user's runs hold now."""
    return pb.Quota(
        user_name=row.user_name,
        priority=row.priority,
        node_group=row.node_group,
        max_nodes=row.max_nodes,
        used_nodes=used,
    )


def _failure_from_proto(f: pb.RunFailure) -> Failure:
    """An agent's failure report (message cut to 1,000 characters)."""
    return Failure(
        failure_class=FailureClass(f.failure_class),
        node_id=f.node_id,
        node_rank=f.node_rank,
        local_rank=f.local_rank,
        exit_code=f.exit_code,
        signal=f.signal,
        failed_at=f.failed_at,
        message=f.message[:1000],
        hang=f.hang,
    )


def run_facts(report: pb.RunReport) -> NodeRunFacts:
    """What ``ops.report_runs`` stores of one run report; the last output is the newest of its ranks'."""
    last_output = max([0.0, *(r.last_output_at for r in report.ranks)])
    return NodeRunFacts(
        task_id=report.task_id,
        run_id=report.run_id,
        phase=NodePhase(report.phase or 0),
        last_output_at=last_output,
        failure=_failure_from_proto(report.failure) if report.HasField("failure") else None,
    )


def _describe_priority(level: int | None) -> str:
    """A priority level's name, or ``AUTO``."""
    return "AUTO" if level is None else priority.name(level)
