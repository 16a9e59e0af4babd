"""Moving chain replicas between storage nodes with the cluster's existing admin calls.

The calls are storage ``CreateTarget`` and mgmtd ``SetChains``: ``join --storage`` takes a fair share of the replicas
onto the new node, ``leave`` moves the leaving node's replicas onto the others. A moved replica is a new, empty target
at the end of its chain (public state offline): mgmtd's chain scan makes it waiting, then syncing, and the chain's
serving targets copy every chunk to it (storage recovery) until it serves. The old target leaves the chain in the same
``SetChains``, unless it is the chain's only serving copy: then it leaves once the new one serves.

Which replicas move is pure (``moves_onto``, ``moves_off``: unit-tested); ``apply_move`` does the calls.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from ff_cluster import MgmtdClient
from ff_fsprotocol.routing import RoutingView
from ff_rpc.client import one_call
from fireflyer.common.v1 import common_pb2
from fireflyer.mgmtd.v1 import mgmtd_pb2 as mpb
from fireflyer.storage.v1 import storage_pb2 as spb
from fireflyer.storage.v1.storage_client import StorageServiceClient
from hf3fs.placement import target_id_for

POLL_S = 0.2
CALL_TIMEOUT_S = 10.0
# How long a move of a chain's only serving copy waits for its new target to serve before the old one leaves.
SYNC_TIMEOUT_S = 600.0

# chain id -> the node ids of its targets, in chain order
ChainNodes = Mapping[int, Sequence[int]]


class ReplicaError(Exception):
    """A replica cannot be moved as asked (no other node to hold it, the chain's last copy, a timeout)."""


@dataclass(frozen=True, kw_only=True)
class Move:
    """Chain ``chain_id``'s replica on ``from_node`` goes to ``to_node`` (0: dropped, the chain has one fewer)."""

    chain_id: int
    from_node: int
    to_node: int


def moves_onto(chains: ChainNodes, new_node: int, storage_nodes: Sequence[int]) -> list[Move]:
    """Replicas to move onto ``new_node`` so it holds its fair share (all replicas over all nodes, rounded down).

    Each is taken from the node holding the most, never into a chain that already has a replica on ``new_node``.
    """
    load = Counter({n: 0 for n in storage_nodes if n != new_node})
    load.update(n for nodes in chains.values() for n in nodes if n != new_node)
    have = sum(1 for nodes in chains.values() if new_node in nodes)
    fair = sum(load.values()) // (len(load) + 1) if load else 0
    taken: set[int] = {c for c, nodes in chains.items() if new_node in nodes}
    moves: list[Move] = []
    while have < fair:
        choices = [(-load[n], n, c) for c, nodes in sorted(chains.items()) if c not in taken for n in nodes]
        if not choices:
            break
        _, from_node, chain_id = min(choices)
        moves.append(Move(chain_id=chain_id, from_node=from_node, to_node=new_node))
        load[from_node] -= 1
        taken.add(chain_id)
        have += 1
    return moves


def moves_off(chains: ChainNodes, leaving: int, storage_nodes: Sequence[int]) -> list[Move]:
    """Every replica on ``leaving``, each to the least-loaded node of ``storage_nodes`` not yet in its chain.

    A replica is dropped (``to_node`` 0) when every other node is in its chain already. Only ``storage_nodes``
    take replicas: a dead node, or another node leaving, may hold some but gets none.

    Raises:
        ReplicaError: ``leaving`` holds a chain's only replica.
    """
    load = Counter({n: 0 for n in storage_nodes if n != leaving})
    load.update(n for nodes in chains.values() for n in nodes if n in load)
    moves: list[Move] = []
    for chain_id, nodes in sorted(chains.items()):
        if leaving not in nodes:
            continue
        if len(nodes) == 1:
            raise ReplicaError(f"chain {chain_id} has its only replica on node {leaving}: it cannot leave")
        free = [n for n in load if n not in nodes]
        to_node = min(free, key=lambda n: (load[n], n)) if free else 0
        if to_node:
            load[to_node] += 1
        moves.append(Move(chain_id=chain_id, from_node=leaving, to_node=to_node))
    return moves


def moves_off_all(chains: ChainNodes, leaving: Sequence[int], storage_nodes: Sequence[int]) -> list[Move]:
    """The replicas of every node in ``leaving``, moved node after node to nodes that stay (as ``moves_off``).

    Raises:
        ReplicaError: a chain would lose its last replica (before any move is made: check with this first).
    """
    staying = [n for n in storage_nodes if n not in leaving]
    after = {chain_id: list(nodes) for chain_id, nodes in chains.items()}
    moves: list[Move] = []
    for node in leaving:
        for move in moves_off(after, node, staying):
            after[move.chain_id] = [n for n in (move.to_node if n == node else n for n in after[move.chain_id]) if n]
            moves.append(move)
    return moves


def chain_nodes(info: mpb.RoutingInfo) -> dict[int, list[int]]:
    """Chain id -> the storage nodes of its replicas, in chain order (what ``moves_onto`` and ``moves_off`` take)."""
    return {c.chain_id: [t.node_id for t in c.targets] for c in info.chains}


def alive_storage_nodes(info: mpb.RoutingInfo) -> list[int]:
    """The storage nodes that may take replicas (alive and enabled), by node id."""
    return sorted(
        n.node_id
        for n in info.nodes
        if n.node_type == common_pb2.NODE_TYPE_STORAGE and n.status == mpb.NODE_STATUS_ALIVE and n.enabled
    )


async def routing(mgmtd: MgmtdClient) -> mpb.RoutingInfo:
    """The routing info mgmtd holds now (chains, targets, nodes)."""
    info: mpb.RoutingInfo = (await mgmtd.mgmtd.get_routing_info(mpb.GetRoutingInfoRequest())).routing_info
    return info


async def apply_move(mgmtd: MgmtdClient, token: str, move: Move, sync_timeout_s: float = SYNC_TIMEOUT_S) -> int:
    """Do ``move``: a new target on ``to_node`` (not for a drop), the chain without the old one.

    Returns the new target's id (0 for a drop). Where another target of the chain serves, the old one leaves in the
    same ``SetChains`` that adds the new one, which syncs afterwards (see ``wait_serving``). Where the old one is the
    chain's only serving copy (a chain of one replica, or the others still syncing), the new one joins first and the
    old one leaves only once the new one serves (within ``sync_timeout_s``): else the chain would lose its data.

    Raises:
        ReplicaError: the chain or a node is not there (routing changed meanwhile); a drop of the chain's only
            serving copy; the new target not serving in time (the old one then stays in the chain).
        RpcError: a call failed.
    """
    info = await routing(mgmtd)
    chain, _, kept = _split(info, move)
    serving_left = any(t.public_state == mpb.PUBLIC_TARGET_STATE_SERVING for t in kept)
    if not move.to_node:
        if not serving_left:
            raise ReplicaError(f"chain {move.chain_id}: node {move.from_node} holds its only serving copy")
        await _set_targets(mgmtd, chain, kept)
        return 0
    node = RoutingView(info).node(move.to_node)
    if node is None:
        raise ReplicaError(f"node {move.to_node} is not registered")
    new_target_id = await _target_on(node.grpc, token, move.chain_id, move.to_node, info)
    new = mpb.Target(
        target_id=new_target_id,
        node_id=move.to_node,
        public_state=mpb.PUBLIC_TARGET_STATE_OFFLINE,
        local_state=mpb.LOCAL_TARGET_STATE_OFFLINE,
    )
    if serving_left:
        await _set_targets(mgmtd, chain, [*kept, new])
        return new_target_id
    await _set_targets(mgmtd, chain, [*chain.targets, new])  # make before break: it syncs from the old one
    await wait_serving(mgmtd, [new_target_id], sync_timeout_s)
    chain, _, kept = _split(await routing(mgmtd), move)
    await _set_targets(mgmtd, chain, kept)
    return new_target_id


def _split(info: mpb.RoutingInfo, move: Move) -> tuple[mpb.Chain, list[mpb.Target], list[mpb.Target]]:
    """The move's chain as routing has it, its targets on the move's old node, and the others."""
    chain = next((c for c in info.chains if c.chain_id == move.chain_id), None)
    if chain is None:
        raise ReplicaError(f"chain {move.chain_id} is not in the routing info")
    old = [t for t in chain.targets if t.node_id == move.from_node]
    if not old:
        raise ReplicaError(f"chain {move.chain_id} has no replica on node {move.from_node} any more")
    return chain, old, [t for t in chain.targets if t.node_id != move.from_node]


async def _set_targets(mgmtd: MgmtdClient, chain: mpb.Chain, targets: Sequence[mpb.Target]) -> None:
    updated = mpb.Chain(chain_id=chain.chain_id, version=chain.version, targets=targets)
    await mgmtd.mgmtd.set_chains(mpb.SetChainsRequest(chains=[updated]))


async def _target_on(address: str, token: str, chain_id: int, node_id: int, info: mpb.RoutingInfo) -> int:
    """A target of ``chain_id`` on storage node ``node_id`` (at ``address``): one it still holds, else a new one.

    The one it still holds from an earlier move off it syncs what it missed, as a restarted target does (a node holds
    one target per chain). A new one gets an id of that node's (``target_id_for``: no other node's target can have it).
    """
    held = await one_call(
        address,
        StorageServiceClient,
        lambda c: c.list_targets(spb.ListTargetsRequest()),
        token=token,
        timeout_s=CALL_TIMEOUT_S,
    )
    for target in held.targets:
        if target.chain_id == chain_id:
            return int(target.target_id)
    used = {int(t.target_id) for t in held.targets} | {t.target_id for c in info.chains for t in c.targets}
    target_id = new_target_id(node_id, used)
    request = spb.CreateTargetRequest(target_id=target_id, chain_id=chain_id, disk_index=0)
    await one_call(
        address, StorageServiceClient, lambda c: c.create_target(request), token=token, timeout_s=CALL_TIMEOUT_S
    )
    return target_id


def new_target_id(node_id: int, used: Collection[int]) -> int:
    """The first id of ``node_id``'s own range (disk 0) that is not in ``used``.

    Raises:
        ReplicaError: the node's range is full.
    """
    for slot in range(100):
        candidate = target_id_for(node_id, 0, slot)
        if candidate not in used:
            return candidate
    raise ReplicaError(f"node {node_id} has no free target id on disk 0")


async def wait_serving(mgmtd: MgmtdClient, target_ids: Sequence[int], timeout_s: float) -> None:
    """Wait until every one of ``target_ids`` serves (synced).

    Raises:
        ReplicaError: not all serve within ``timeout_s``.
    """
    wanted = {t for t in target_ids if t}
    deadline = time.monotonic() + timeout_s
    while wanted:
        info = await routing(mgmtd)
        states = {t.target_id: t.public_state for c in info.chains for t in c.targets}
        waiting = {t: int(states.get(t, 0)) for t in wanted if states.get(t) != mpb.PUBLIC_TARGET_STATE_SERVING}
        if not waiting:
            return
        if time.monotonic() > deadline:
            names = ", ".join(f"{t}:{_state_name(s)}" for t, s in waiting.items())
            raise ReplicaError(f"moved replicas not serving after {timeout_s:g}s: {names}")
        await asyncio.sleep(POLL_S)


def _state_name(state: int) -> str:
    if not state:
        return "gone"
    return mpb.PublicTargetState.Name(mpb.PublicTargetState.ValueType(state)).removeprefix("PUBLIC_TARGET_STATE_")
