"""Which runner a group's pipeline gets: threads where each local rank has cores to spare, else the loop."""

from __future__ import annotations

from pathlib import Path

import pytest

from hfreduce import runners
from hfreduce.config import GroupConfig


@pytest.mark.parametrize(
    ("mode", "cores", "local", "expect"),
    [
        ("auto", 2, 1, runners.ThreadRunner),  # 2x1 on the dev box: a core to spare per rank
        ("auto", 2, 2, runners.EventLoop),  # 2x2 on the dev box: four ranks on two cores
        ("auto", 64, 8, runners.ThreadRunner),  # a GPU node: 8 ranks, 64 cores
        ("auto", 12, 8, runners.EventLoop),
        ("threads", 1, 8, runners.ThreadRunner),
        ("loop", 64, 1, runners.EventLoop),
    ],
)
def test_choice_follows_mode_and_cores_per_local_rank(
    monkeypatch: pytest.MonkeyPatch, mode: runners.PipelineMode, cores: int, local: int, expect: type
) -> None:
    monkeypatch.setattr(runners.os, "sched_getaffinity", lambda _pid: set(range(cores)))
    monkeypatch.setattr(runners, "_CPU_MAX", Path("/nonexistent/cpu.max"))
    made = runners.choose(mode, local, 1.0, lambda: None)
    try:
        assert type(made) is expect
    finally:
        made.close()


@pytest.mark.parametrize(("cpu_max", "expect"), [("max 100000\n", 8.0), ("150000 100000\n", 1.5), ("", 8.0)])
def test_a_cgroup_cpu_quota_caps_the_usable_cores(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cpu_max: str, expect: float
) -> None:
    monkeypatch.setattr(runners.os, "sched_getaffinity", lambda _pid: set(range(8)))
    (tmp_path / "cpu.max").write_text(cpu_max)
    monkeypatch.setattr(runners, "_CPU_MAX", tmp_path / "cpu.max")
    assert runners.usable_cores() == expect


def test_a_container_with_a_small_quota_gets_the_loop(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(runners.os, "sched_getaffinity", lambda _pid: set(range(64)))
    (tmp_path / "cpu.max").write_text("300000 100000\n")
    monkeypatch.setattr(runners, "_CPU_MAX", tmp_path / "cpu.max")
    made = runners.choose("auto", 2, 1.0, lambda: None)
    try:
        assert made.mode == "loop"
    finally:
        made.close()


def test_an_unknown_pipeline_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown pipeline 'fibers'"):
        GroupConfig(master_addr="127.0.0.1", master_port=1234, node_rank=0, num_nodes=1, pipeline="fibers")  # type: ignore[arg-type]


def test_the_mode_comes_from_the_environment() -> None:
    env = {"MASTER_ADDR": "h", "MASTER_PORT": "1", "WORLD_SIZE": "1", "RANK": "0", "FF_HFREDUCE_PIPELINE": "loop"}
    assert GroupConfig.from_env(env).pipeline == "loop"
