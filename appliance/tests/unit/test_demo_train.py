"""The training demo's pure parts: which log lines it shows, and its summary refusing facts that contradict a
suspend and resume."""

from __future__ import annotations

from pathlib import Path

import pytest

from ff_appliance.demo_faults import FaultError, FaultRecord, fault_rows, rank_pids
from ff_appliance.demo_train import (
    NUM_STEPS,
    NUM_STEPS_WITH_FAULTS,
    TrainDemo,
    TrainDemoError,
    TrainPlan,
    _resumed,
    _Run,
    summary,
)
from fireflyer.scheduler.v1 import scheduler_pb2 as pb

PLAN = TrainPlan(example=Path("/nowhere"), num_steps=6, preempt_at_step=3, ckpt_every=2)


def test_the_plan_injects_the_faults_in_the_demos_order_and_trains_long_enough_for_them() -> None:
    agent = TrainPlan.for_demo(Path("/x"), faults=["agent"])
    assert (agent.faults, agent.num_steps, agent.quick) == (("agent",), NUM_STEPS, False)
    every = TrainPlan.for_demo(Path("/x"), faults=["hang", "storage", "agent"])
    assert (every.faults, every.num_steps) == (("storage", "agent", "hang"), NUM_STEPS_WITH_FAULTS)
    assert TrainPlan.for_demo(Path("/x"), faults=[]).quick
    with pytest.raises(TrainDemoError, match="no such fault: fire"):
        TrainPlan.for_demo(Path("/x"), faults=["agent", "fire"])


def _demo(lines: list[str]) -> TrainDemo:
    return TrainDemo(["127.0.0.1:1"], "t", PLAN, step=lambda _: None, say=lines.append)


def test_only_rank_0_progress_lines_are_shown_once() -> None:
    shown: list[str] = []
    demo, run = _demo(shown), _Run(task_id=1, dashboard_url="")
    log = (
        "[0] rank 0 of 4: from scratch\n[0] step 2 loss 3.5000 tokens/s 900\n[1] step 2 loss 9 tokens/s 1\n[0] noise\n"
    )
    demo._show(run, 7, 0, log)
    demo._show(run, 7, 0, log + "[0] step 4 loss 2.2500 tokens/s 1000\n")
    assert shown == [
        "[run 0] rank 0 of 4: from scratch",
        "[########................] step    2/6 loss 3.5000 tokens/s 900",
        "[################........] step    4/6 loss 2.2500 tokens/s 1000",
    ]
    assert run.newest_step == 4


def _task(resume_step: int) -> tuple[pb.Task, dict[int, list[tuple[int, float, float]]]]:
    first = pb.Run(
        run_id=1,
        started_at=10,
        suspend_requested_at=20,
        ended_at=21,
        last_checkpoint=pb.Checkpoint(path="/d/MANIFEST.json", step=3, committed_at=20.5),
    )
    second = pb.Run(run_id=2, run_index=1, started_at=30, ended_at=40)
    task = pb.Task(task_id=1, uid=1000, runs=[first, second])
    series = {
        1: [(s, 5.0 - s * 0.5, 10.0 + s) for s in (1, 2, 3)],
        2: [(s, 5.0 - s * 0.5, 30.0 + s) for s in range(resume_step, 7)],
    }
    return task, series


def test_the_summary_states_the_figures() -> None:
    task, series = _task(resume_step=4)
    lines = summary(task, pb.Task(task_id=2, first_started_at=22, finished_at=29), series, None, 1000, PLAN)
    text = "\n".join(lines)
    assert "suspend took   1.0 s" in text and "resumed at     step 4 (checkpoint step 3)" in text
    assert "steps lost     0" in text and "steps 1..6, 6 steps, no gap" in text


def test_the_summary_refuses_a_resume_elsewhere_or_a_stranger_checkpoint() -> None:
    task, series = _task(resume_step=5)  # step 4 never reported
    with pytest.raises(TrainDemoError, match="do not match"):
        summary(task, pb.Task(task_id=2), series, None, 1000, PLAN)
    task, series = _task(resume_step=4)
    with pytest.raises(TrainDemoError, match="do not match"):
        summary(task, pb.Task(task_id=2), series, None, 4242, PLAN)  # not the task's user's


def _faulted_task() -> tuple[pb.Task, dict[int, list[tuple[int, float, float]]]]:
    """Run 2 lost its agent at step 14 (checkpoint 12, trained to 15); run 3 resumed at 13."""
    node = pb.AssignedNode
    runs = [
        pb.Run(
            run_id=2,
            run_index=1,
            started_at=30,
            ended_at=50,
            end_reason=pb.RUN_END_REASON_NODE_LOST,
            last_checkpoint=pb.Checkpoint(step=12),
            nodes=[node(node_id=5), node(node_id=6, node_rank=1)],
        ),
        pb.Run(run_id=3, run_index=2, started_at=55, nodes=[node(node_id=5), node(node_id=7, node_rank=1)]),
    ]
    series = {2: [(s, 1.0, 30.0 + s) for s in range(4, 16)], 3: [(s, 1.0, 60.0 + s) for s in range(13, 21)]}
    return pb.Task(task_id=1, runs=runs), series


def test_fault_rows_state_detection_recovery_and_steps_lost() -> None:
    task, series = _faulted_task()
    storage = FaultRecord(
        kind="storage",
        event="storage-3 SIGKILLed",
        signalled_at=35.0,
        at_step=5,
        run_id=2,
        node_id=9,
        detected_at=38.0,
        detected_by="mgmtd",
        recovered_at=40.5,
        recovered_by="mgmtd",
    )
    agent = FaultRecord(
        kind="agent",
        event="agent-2 SIGKILLed",
        signalled_at=44.0,
        at_step=14,
        run_id=2,
        node_id=6,
        detected_at=54.0,
        detected_by="scheduler: NODE_LOST",
    )
    rows = dict(fault_rows(task, series, [storage, agent]))
    assert "recovered after 5.5 s" in rows["storage-3 SIGKILLed"] and "steps lost 0" in rows["storage-3 SIGKILLed"]
    text = rows["agent-2 SIGKILLed"]
    assert "detected after 10.0 s" in text and "training again after 29.0 s" in text
    assert "from checkpoint 12" in text and "steps lost 3" in text and "nodes [5, 7]" in text


def test_fault_rows_refuse_a_resume_at_another_step_than_the_checkpoint() -> None:
    task, series = _faulted_task()
    series[3] = [(s, 1.0, 60.0 + s) for s in range(14, 21)]  # resumed at 14: checkpoint 12 says 13
    agent = FaultRecord(kind="agent", event="agent-2 SIGKILLed", signalled_at=44.0, at_step=14, run_id=2, node_id=6)
    with pytest.raises(FaultError, match="resumed at step 14"):
        fault_rows(task, series, [agent])


def test_the_rank_is_found_by_the_environment_the_agent_gave_it(tmp_path: Path) -> None:
    environs = {
        11: "MARSV2_RUN_ID=7\0RANK=1\0LOCAL_RANK=1\0",
        12: "MARSV2_RUN_ID=7\0RANK=1\0LOCAL_RANK=0\0",
        13: "MARSV2_RUN_ID=8\0RANK=1\0LOCAL_RANK=1\0",
        14: "MARSV2_RUN_ID=7\0LOCAL_RANK=1\0RANK=1",
    }
    for pid, env in environs.items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "environ").write_bytes(env.encode())
    (tmp_path / "self").mkdir()
    assert rank_pids(7, 1, 1, proc=tmp_path) == [11, 14]


def test_the_resume_is_the_first_later_run_that_trains_not_always_run_1() -> None:
    run = _Run(task_id=1, dashboard_url="", printed={(10, 129), (12, 140)})
    preempted = pb.Run(run_id=10, run_index=0, state=pb.RUN_STATE_SUSPENDED)
    failed = pb.Run(run_id=11, run_index=1, state=pb.RUN_STATE_FAILED)  # e.g. its port was taken: no step
    resumed = pb.Run(run_id=12, run_index=2, state=pb.RUN_STATE_RUNNING)
    assert not _resumed(pb.Task(runs=[preempted, failed]), run)
    assert _resumed(pb.Task(runs=[preempted, failed, resumed]), run)
    assert not _resumed(pb.Task(runs=[preempted, failed, resumed]), _Run(task_id=1, dashboard_url=""))  # no step yet
