"""The simulator: it drives the service's own tick pipeline, and its figures add up on small traces."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from ff_scheduler.core import priority as p
from ff_scheduler.core import tick
from ff_scheduler.core.policy import LifecyclePolicy
from ff_scheduler.sim import engine
from ff_scheduler.sim.__main__ import run as sim_main
from ff_scheduler.sim.engine import SimConfig, Simulation
from ff_scheduler.sim.failures import FailureKind, FailureModel
from ff_scheduler.sim.report import POLICIES, figures
from ff_scheduler.sim.trace import Job, SyntheticTrace, TraceError, read_csv, write_csv

LIFE = LifecyclePolicy(ack_window_s=5, default_grace_s=120)
CONFIG = SimConfig(num_nodes=4, suspend_overhead_s=30, restart_overhead_s=60)


def test_the_simulator_calls_the_service_tick_code_not_a_copy() -> None:
    assert engine.plan_tick is tick.plan_tick


def test_fifo_runs_jobs_back_to_back() -> None:
    jobs = [
        Job(job_id=1, submit_s=0, num_nodes=4, duration_s=100, priority=p.LOW, user="a"),
        Job(job_id=2, submit_s=10, num_nodes=4, duration_s=50, priority=p.HIGH, user="b"),
    ]
    result = Simulation(jobs, POLICIES["fifo"], LIFE, CONFIG, "fifo").run()
    ends = {r.job.job_id: r.end_s for r in result.records}
    assert ends == {1: 100, 2: 150}
    f = figures(result)
    assert f.num_suspends == 0 and f.utilization == pytest.approx(1.0)
    assert f.mean_jct_h == pytest.approx(((100 - 0) + (150 - 10)) / 2 / 3600)


def test_time_sharing_suspends_the_low_job_and_resumes_it_with_its_work_kept() -> None:
    jobs = [
        Job(job_id=1, submit_s=0, num_nodes=4, duration_s=1000, priority=p.LOW, user="a"),
        Job(job_id=2, submit_s=700, num_nodes=4, duration_s=100, priority=p.HIGH, user="b"),
    ]
    result = Simulation(jobs, POLICIES["hai"], LIFE, CONFIG, "hai").run()  # min run time 600 s: 700 is past it
    rec = {r.job.job_id: r for r in result.records}
    # the LOW job is flagged at 700, checkpoints for 30 s; HIGH runs 730..830; LOW resumes at 830, reloads
    # for 60 s, then does its remaining 300 s.
    assert rec[2].end_s == pytest.approx(830)
    assert rec[1].num_suspends == 1
    assert rec[1].end_s == pytest.approx(830 + 60 + 300)
    f = figures(result)
    assert f.preemption_lost_node_h == pytest.approx((30 + 60) * 4 / 3600)


def test_minimum_run_time_delays_preemption() -> None:
    jobs = [
        Job(job_id=1, submit_s=0, num_nodes=4, duration_s=1000, priority=p.LOW, user="a"),
        Job(job_id=2, submit_s=100, num_nodes=4, duration_s=100, priority=p.HIGH, user="b"),
    ]
    never = replace(CONFIG, checkpoint_interval_s=0)
    rec = {r.job.job_id: r for r in Simulation(jobs, POLICIES["hai"], LIFE, never, "hai").run().records}
    assert rec[2].first_start_s == pytest.approx(630)  # suspended at 600 (min run time), 30 s to checkpoint


def test_a_task_with_a_fresh_checkpoint_goes_at_once_and_drops_the_steps_since() -> None:
    jobs = [
        Job(job_id=1, submit_s=0, num_nodes=4, duration_s=1000, priority=p.LOW, user="a"),
        Job(job_id=2, submit_s=610, num_nodes=4, duration_s=100, priority=p.HIGH, user="b"),
    ]
    rec = {r.job.job_id: r for r in Simulation(jobs, POLICIES["hai"], LIFE, CONFIG, "hai").run().records}
    # checkpoints at 300 and 600 s of work; at 610 the last is 10 s old (a save takes 30): it goes at once,
    # losing 10 s on 4 nodes; HIGH runs 610..710; LOW reloads 60 s and redoes 400 s from its checkpoint at 600.
    assert rec[2].first_start_s == pytest.approx(610)
    assert rec[1].end_s == pytest.approx(710 + 60 + 400)
    assert rec[1].lost_node_s == pytest.approx((10 + 60) * 4)


def test_a_victim_is_chosen_by_its_checkpoint_through_the_service_code() -> None:
    """Two LOW jobs of 2 nodes; the one whose checkpoint is fresher when the HIGH job comes is preempted."""
    jobs = [
        Job(job_id=1, submit_s=0, num_nodes=2, duration_s=5000, priority=p.LOW, user="a"),
        Job(job_id=2, submit_s=100, num_nodes=2, duration_s=5000, priority=p.LOW, user="b"),
        Job(job_id=3, submit_s=1250, num_nodes=2, duration_s=100, priority=p.HIGH, user="c"),
    ]
    # at 1250 s job 1 has done 1250 s (checkpoint at 1200: 50 s old), job 2 1150 s (at 900: 250 s old)
    rec = {r.job.job_id: r for r in Simulation(jobs, POLICIES["hai"], LIFE, CONFIG, "hai").run().records}
    assert (rec[1].num_suspends, rec[2].num_suspends) == (1, 0)
    classic = {r.job.job_id: r for r in Simulation(jobs, POLICIES["hai-classic"], LIFE, CONFIG, "c").run().records}
    assert (classic[1].num_suspends, classic[2].num_suspends) == (0, 1)  # HAI: the latest submitted


def test_failures_restart_runs_from_their_checkpoints() -> None:
    jobs = [Job(job_id=i, submit_s=0, num_nodes=2, duration_s=20_000, priority=p.NORMAL, user="a") for i in (1, 2)]
    failing = replace(CONFIG, failures=FailureModel(scale=20_000, repair_s=600), failure_seed=5)
    result = Simulation(jobs, POLICIES["priority"], LIFE, failing, "priority").run()
    f = figures(result)
    assert not result.unfinished
    assert f.num_failures > 0 and f.failure_lost_node_h > 0 and f.num_suspends == 0
    # each failure loses at most a checkpoint interval and a reload on each of the run's 2 nodes
    assert f.failure_lost_node_h * 3600 <= f.num_failures * 2 * (300 + 60) + 1e-6
    held = sum(r.held_node_s for r in result.records)
    assert held == pytest.approx(2 * 2 * 20_000 + f.failure_lost_node_h * 3600)


def test_paper_failure_rates_are_the_tables_sums() -> None:
    arrivals = FailureModel().arrivals(num_nodes=1250, seed=3)
    events = []
    while arrivals.next is not None and arrivals.next.at_s < 365 * 86400:
        events.append(arrivals.next)
        arrivals.advance()
    hardware = sum(e.kind is FailureKind.HARDWARE for e in events)
    link = len(events) - hardware
    # a year on Fire-Flyer 2's 1,250 nodes: ~407 hardware failures (203 in 182 days), ~223 flash cuts (213 in 348)
    assert 330 < hardware < 490 and 170 < link < 280
    with pytest.raises(ValueError, match="must be >= 0"):
        FailureModel(scale=-1)


def test_synthetic_trace_is_seeded_and_round_trips_through_csv(tmp_path: Path) -> None:
    gen = SyntheticTrace(num_jobs=50, num_nodes=8)
    jobs = gen.generate(7)
    assert jobs == gen.generate(7) and jobs != gen.generate(8)
    assert all(1 <= j.num_nodes <= 8 and p.is_level(j.priority) for j in jobs)
    path = tmp_path / "trace.csv"
    write_csv(path, jobs)
    back = read_csv(path)
    assert [(j.job_id, j.num_nodes, j.priority, j.user) for j in back] == [
        (j.job_id, j.num_nodes, j.priority, j.user) for j in jobs
    ]


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("job_id,submit_s\n1,0\n", "missing columns"),
        ("job_id,submit_s,num_nodes,duration_s,priority,user\n1,0,0,10,10,a\n", ":2:"),
        ("job_id,submit_s,num_nodes,duration_s,priority,user\n1,0,1,10,7,a\n", "not a level"),
    ],
)
def test_bad_trace_lines_are_named(tmp_path: Path, text: str, error: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(TraceError, match=error):
        read_csv(path)


def test_cli_compares_policies_side_by_side(capsys: pytest.CaptureFixture[str]) -> None:
    assert sim_main(["--jobs", "40", "--nodes", "8", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert "time-sharing / FIFO: mean JCT" in out and "time-sharing / priority without preemption" in out
    assert sim_main(["--jobs", "40", "--nodes", "8", "--failures", "100"]) == 0
    assert "failures at 100x the paper's rates" in capsys.readouterr().out
    assert sim_main(["--policies", "nope"]) == 2
    assert sim_main(["--failures", "-1"]) == 2
    assert sim_main(["--checkpoint-interval-s", "-5"]) == 2
