"""The training demo's pure parts: which log lines it shows, and its summary refusing facts that contradict a
suspend and resume."""

from __future__ import annotations

from pathlib import Path

import pytest

from ff_appliance.demo_train import TrainDemo, TrainDemoError, TrainPlan, _Run, summary
from fireflyer.scheduler.v1 import scheduler_pb2 as pb

PLAN = TrainPlan(example=Path("/nowhere"), num_steps=6, preempt_at_step=3, ckpt_every=2, quick=True)


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
    first = pb.Run(run_id=1, started_at=10, suspend_requested_at=20, ended_at=21,
                   last_checkpoint=pb.Checkpoint(path="/d/MANIFEST.json", step=3, committed_at=20.5))  # fmt: skip
    second = pb.Run(run_id=2, run_index=1, started_at=30, ended_at=40)
    task = pb.Task(task_id=1, uid=1000, runs=[first, second])
    series = {1: [(s, 5.0 - s * 0.5, 10.0 + s) for s in (1, 2, 3)],
              2: [(s, 5.0 - s * 0.5, 30.0 + s) for s in range(resume_step, 7)]}  # fmt: skip
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
