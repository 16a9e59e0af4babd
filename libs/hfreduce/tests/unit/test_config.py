"""Group configuration from arguments and from the launcher's environment."""

from __future__ import annotations

import pytest

from hfreduce.config import GroupConfig

HAI_ENV = {
    "MASTER_IP": "10.0.0.1",
    "MASTER_PORT": "29500",
    "WORLD_SIZE": "4",
    "RANK": "2",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "8",
}


def test_hai_variables_mean_nodes() -> None:
    cfg = GroupConfig.from_env(HAI_ENV)
    assert (cfg.num_nodes, cfg.node_rank, cfg.local_rank, cfg.local_world_size) == (4, 2, 1, 8)
    assert cfg.world_size == 32 and cfg.rank == 17
    assert cfg.master_addr == "10.0.0.1"


def test_prefixed_variables_and_overrides_win() -> None:
    env = {
        **HAI_ENV,
        "FF_HFREDUCE_NUM_NODES": "2",
        "FF_HFREDUCE_NODE_RANK": "1",
        "FF_HFREDUCE_TIMEOUT_S": "2.5",
        "FF_HFREDUCE_COMPRESSION": "bf16",
        "FF_HFREDUCE_ALGORITHM": "ring",
        "FF_HFREDUCE_ZONE": "east",
    }
    cfg = GroupConfig.from_env(env, chunk_size_bytes=4096)
    assert (cfg.num_nodes, cfg.node_rank, cfg.timeout_s) == (2, 1, 2.5)
    assert (cfg.compression, cfg.algorithm, cfg.zone, cfg.chunk_size_bytes) == ("bf16", "ring", "east", 4096)


def test_missing_master_is_a_clear_error() -> None:
    env = {k: v for k, v in HAI_ENV.items() if k != "MASTER_IP"}
    with pytest.raises(ValueError, match="MASTER_ADDR or MASTER_IP"):
        GroupConfig.from_env(env)


@pytest.mark.parametrize(
    "bad",
    [
        {"node_rank": 4},
        {"local_rank": 8},
        {"timeout_s": 0.0},
        {"chunk_size_bytes": 100},
        {"algorithm": "star"},
        {"compression": "fp8"},
        {"master_port": 0},
    ],
)
def test_invalid_values_are_rejected(bad: dict[str, object]) -> None:
    args: dict[str, object] = {
        "master_addr": "h",
        "master_port": 1,
        "node_rank": 0,
        "num_nodes": 4,
        "local_rank": 0,
        "local_world_size": 8,
        **bad,
    }
    with pytest.raises(ValueError):
        GroupConfig(**args)  # type: ignore[arg-type]
