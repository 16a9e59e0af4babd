"""Storage administration: create targets, upload chains and a chain table, offline a target, list their states."""

from __future__ import annotations

from dataclasses import dataclass

from ff_cluster import MgmtdClient
from ff_fsprotocol.routing import RoutingView
from ff_rpc.client import one_call
from fireflyer.mgmtd.v1 import mgmtd_pb2 as mpb
from fireflyer.storage.v1 import storage_pb2 as spb
from fireflyer.storage.v1.storage_client import StorageServiceClient
from hf3fs.placement import PlacedChain, place_chains


@dataclass(frozen=True)
class ChainSetup:
    """The chains and the chain table mgmtd stored, as it answered ``SetChains`` and ``SetChainTable``."""

    chains: list[mpb.Chain]
    table: mpb.ChainTable


async def create_targets(view: RoutingView, token: str, chains: list[PlacedChain]) -> None:
    """Creates each placed target on its storage node (CreateTarget), one call at a time.

    Raises:
        ValueError: a target's node is not in the routing view.
        RpcError: a node refused or could not be reached; the targets created before it stay.
    """
    for chain in chains:
        for t in chain.targets:
            node = view.node(t.node_id)
            if node is None:
                raise ValueError(f"node {t.node_id} is not registered")
            request = spb.CreateTargetRequest(target_id=t.target_id, chain_id=chain.chain_id, disk_index=t.disk_index)
            await _create_target(node.grpc, request, token)


async def _create_target(address: str, request: spb.CreateTargetRequest, token: str) -> None:
    await one_call(address, StorageServiceClient, lambda c: c.create_target(request), token=token, timeout_s=10.0)


async def setup_chain_table(
    mgmtd: MgmtdClient,
    token: str,
    *,
    num_disks: int = 1,
    targets_per_disk: int = 2,
    replication: int = 3,
    table_id: int = 1,
) -> ChainSetup | None:
    """Place chains over every alive storage node, create their targets, upload chains and the table.

    Returns None (and changes nothing) when the cluster already has chains.
    """
    info = (await mgmtd.mgmtd.get_routing_info(mpb.GetRoutingInfoRequest())).routing_info
    if info.chains:
        return None
    view = RoutingView(info)
    storage = sorted(n.node_id for n in info.nodes if n.node_type == 3 and n.status == mpb.NODE_STATUS_ALIVE)
    placed = place_chains(storage, num_disks, targets_per_disk, replication)
    await create_targets(view, token, placed)
    chains = [
        mpb.Chain(
            chain_id=c.chain_id,
            version=0,
            targets=[mpb.Target(target_id=t.target_id, node_id=t.node_id) for t in c.targets],
        )
        for c in placed
    ]
    saved = await mgmtd.mgmtd.set_chains(mpb.SetChainsRequest(chains=chains))
    table = mpb.ChainTable(table_id=table_id, version=0, chain_ids=[c.chain_id for c in placed])
    saved_table = await mgmtd.mgmtd.set_chain_table(mpb.SetChainTableRequest(chain_table=table))
    return ChainSetup(list(saved.chains), saved_table.chain_table)


def render_chains(info: mpb.RoutingInfo) -> str:
    """One line per chain: id, version, then target:public/local head to tail."""
    pub = {v: k.removeprefix("PUBLIC_TARGET_STATE_").lower() for k, v in mpb.PublicTargetState.items()}
    loc = {v: k.removeprefix("LOCAL_TARGET_STATE_").lower() for k, v in mpb.LocalTargetState.items()}
    lines = []
    for c in info.chains:
        members = " -> ".join(
            f"{t.target_id}@{t.node_id}:{pub[t.public_state]}/{loc[t.local_state]}" for t in c.targets
        )
        lines.append(f"chain {c.chain_id} v{c.version}: {members}")
    return "\n".join(lines)
