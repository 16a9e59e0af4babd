"""Fixtures of the storage unit tests: a node's config in the test's folder; a node whose target is a whole chain."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ff_fsprotocol.routing import RoutingView
from ff_storage.dataserver import TransferBoxes
from ff_storage.node import StorageNode
from ff_storage.node_state import NodeConfig
from fireflyer.mgmtd.v1 import mgmtd_pb2 as mpb

WholeChainNode = Callable[[int, int, int], StorageNode]
NodeConfigOf = Callable[..., NodeConfig]


@pytest.fixture
def node_config(tmp_path: Path) -> NodeConfigOf:
    """Makes the config of a node ``node_id`` with one disk in its own folder of the test's (1 MiB IOs, 16 MiB
    batches; ``forward_timeout_s`` 5 s unless given)."""

    def make(node_id: int, *, fsync: bool, forward_timeout_s: float = 5.0) -> NodeConfig:
        return NodeConfig(
            node_id=node_id,
            disks=[tmp_path / f"node{node_id}" / "disk0"],
            targets_file=tmp_path / f"node{node_id}" / "targets.json",
            cluster_token="t" * 32,
            max_io_bytes=1 << 20,
            max_batch_bytes=1 << 24,
            forward_timeout_s=forward_timeout_s,
            data_wait_s=1.0,
            fsync=fsync,
        )

    return make


@pytest.fixture
def whole_chain_node(node_config: NodeConfigOf) -> Iterator[WholeChainNode]:
    """Makes a node ``(node_id, target_id, chain_id)`` whose one target is the whole chain (head and tail), serving.

    Routing at version 1, the chain at version 1; no fsync. The nodes made are closed after the test.
    """
    made: list[StorageNode] = []

    def make(node_id: int, target_id: int, chain_id: int) -> StorageNode:
        node = StorageNode(node_config(node_id, fsync=False), TransferBoxes())
        made.append(node)
        node.state.create_target(target_id, chain_id, 0)
        serving = mpb.Target(
            target_id=target_id, node_id=node_id, public_state=mpb.PUBLIC_TARGET_STATE_SERVING, chain_id=chain_id
        )
        chain = mpb.Chain(chain_id=chain_id, version=1, targets=[serving])
        node.state.on_routing(RoutingView(mpb.RoutingInfo(version=1, chains=[chain])))
        node.state.targets[target_id].role.sync_done(1)
        return node

    yield make
    for node in made:
        node.close()
