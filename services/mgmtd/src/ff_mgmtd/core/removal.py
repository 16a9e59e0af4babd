"""When a node may be forgotten (RemoveNode), and which id a new node gets so a removed one is never reused."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ff_mgmtd.core.errors import NoFreeId
from ff_mgmtd.core.model import Node, NodeStatus


def removal_refusals(node: Node, held_targets: Sequence[tuple[int, int]], lease_duration_s: float) -> list[str]:
    """Why ``node`` may not be removed yet; empty when it may.

    A node is forgotten only once nothing depends on it: it is dead (a live node would register again or be
    routed to), disabled (an admin decided it goes), and no chain holds a target on it (its data would be lost).

    Args:
        node: the node as stored.
        held_targets: ``(target_id, chain_id)`` of every chain target on the node.
        lease_duration_s: T, to say how long a stopped node stays alive.
    """
    refusals = []
    if node.status is NodeStatus.ALIVE:
        refusals.append(
            f"it is alive (its lease has not expired): stop its service, then mgmtd declares it dead within "
            f"{lease_duration_s:g}s of its last heartbeat"
        )
    if node.enabled:
        refusals.append("it is enabled: disable it first (SetNodeEnabled)")
    if held_targets:
        listed = ", ".join(f"{target_id} (chain {chain_id})" for target_id, chain_id in held_targets)
        refusals.append(f"it holds chain targets {listed}: move its replicas to other nodes first")
    return refusals


# The ids mgmtd assigns itself (a registration with node_id 0, as `fireflyer join` makes) start here; the ids below
# are the deployer's to give (the appliance numbers its planned instances from 1), so the two never collide.
AUTO_NODE_ID_BASE = 100_000


def lowest_free_id(taken: Iterable[int], max_id: int, start: int = 1) -> int:
    """The lowest id in ``start..max_id`` not in ``taken`` (registered and removed ids alike).

    Used once ``max_id`` itself is taken; before that a new node gets the largest taken id + 1, so a removed
    id is never handed out again (the ids of its targets, and history elsewhere such as the scheduler's, name
    the old node).

    Raises:
        NoFreeId: every id in ``start..max_id`` is taken.
    """
    expected = start
    for node_id in sorted(set(taken)):
        if node_id < expected:
            continue
        if node_id > expected:
            break
        expected = node_id + 1
    if expected > max_id:
        raise NoFreeId(f"every node id in {start}..{max_id} is taken")
    return expected
