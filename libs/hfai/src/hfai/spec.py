"""Building a TaskSpec from what a user types (shared by the SDK and the CLI)."""

from __future__ import annotations

from fireflyer.scheduler.v1 import scheduler_pb2 as pb


def task_spec(
    argv: list[str],
    *,
    nodes: int = 1,
    priority: int | None = None,
    group: str = "",
    name: str = "",
    env: dict[str, str] | None = None,
    image: str = "",
    watchdog_time_s: float = 0.0,
    suspend_grace_s: float = 0.0,
    max_restarts: int | None = None,
    whole_life_state: int = 0,
    auto_priority: bool = False,
) -> pb.TaskSpec:
    """The TaskSpec of ``argv`` run on ``nodes`` nodes of ``group``; unset priority and max restarts: the scheduler's.

    ``watchdog_time_s`` and ``suspend_grace_s`` 0 take the cluster's defaults.
    """
    spec = pb.TaskSpec(
        name=name,
        argv=argv,
        env=env or {},
        num_nodes=nodes,
        node_group=group,
        image=image,
        watchdog_time_s=watchdog_time_s,
        suspend_grace_s=suspend_grace_s,
        whole_life_state=whole_life_state,
        auto_priority=auto_priority,
    )
    if priority is not None:
        spec.priority = priority
    if max_restarts is not None:
        spec.max_restarts = max_restarts
    return spec
