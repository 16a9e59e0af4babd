"""Which runner a group's pipeline gets: threads where each local rank has cores to spare, else the loop."""

from __future__ import annotations

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
    made = runners.choose(mode, local, 1.0, lambda: None)
    try:
        assert type(made) is expect
    finally:
        made.close()


def test_an_unknown_pipeline_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown pipeline 'fibers'"):
        GroupConfig(master_addr="127.0.0.1", master_port=1234, node_rank=0, num_nodes=1, pipeline="fibers")  # type: ignore[arg-type]


def test_the_mode_comes_from_the_environment() -> None:
    env = {"MASTER_ADDR": "h", "MASTER_PORT": "1", "WORLD_SIZE": "1", "RANK": "0", "FF_HFREDUCE_PIPELINE": "loop"}
    assert GroupConfig.from_env(env).pipeline == "loop"
