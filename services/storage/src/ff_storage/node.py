"""The storage node: its targets, the CRAQ update pipeline (head and replicas), reads, recovery, repair.

Decisions come from ``core`` (IO checks, version rules, sync diff, the target's state machine); disk work runs in
threads on the chunk engine. The node is its state and four collaborators, each given what it uses:

- ``node_state.NodeState``: targets, the routing followed, per-chunk locks, the lease, background tasks;
- ``peers.Peers``: calls to the other storage nodes and the forward wire;
- ``writes.ChainWriter``: the CRAQ update pipeline (state, peers, and recovery for repairs at the head);
- ``reads.ChunkReader``: chunk reads (state, and recovery for repairs of a damaged copy);
- ``recovery.Recovery``: sync of a returning target and repair of a damaged chunk (state, peers).
"""

from __future__ import annotations

from ff_storage.dataserver import TransferBoxes
from ff_storage.node_state import NodeConfig, NodeState, Target
from ff_storage.peers import Peers
from ff_storage.reads import ChunkReader
from ff_storage.recovery import Recovery
from ff_storage.writes import ChainWriter

__all__ = ["NodeConfig", "StorageNode", "Target"]


class StorageNode:
    """One storage service's node, put together (see the module doc)."""

    def __init__(self, config: NodeConfig, boxes: TransferBoxes) -> None:
        self.state = NodeState(config, boxes)
        self.peers = Peers(self.state)
        self.recovery = Recovery(self.state, self.peers)
        self.writer = ChainWriter(self.state, self.peers, self.recovery)
        self.reader = ChunkReader(self.state, self.recovery)

    async def close_channels(self) -> None:
        """Close the gRPC channels to other storage nodes (the data-path connections go in ``close``)."""
        await self.peers.close_channels()

    def close(self) -> None:
        """The data-path connections, then the chunk engines (after ``state.finish_updates``)."""
        self.peers.close()
        self.state.close()
