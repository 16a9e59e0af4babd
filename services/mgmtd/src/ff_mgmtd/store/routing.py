"""Nodes, chains, chain tables and configs: reads, and the writes of the primary (fenced)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.orm import Session

from ff_mgmtd.core.errors import Conflict, InvalidRequest, NotFoundError, StaleVersion
from ff_mgmtd.core.model import (
    Chain,
    ChainTable,
    ChainTarget,
    ConfigEntry,
    Endpoint,
    LocalTargetState,
    Node,
    NodeRegistration,
    NodeRemoval,
    NodeStatus,
    NodeType,
    PublicTargetState,
    RoutingInfo,
)
from ff_mgmtd.core.removal import AUTO_NODE_ID_BASE, lowest_free_id, removal_refusals
from ff_mgmtd.core.validation import MAX_ID
from ff_mgmtd.store.cluster_state import (
    Fence,
    bump_routing_version,
    check_fence,
    get_cluster_id,
    routing_version,
)
from ff_mgmtd.store.schema import chain_tables, chain_targets, chains, configs, nodes, removed_nodes


def _node(row: Any) -> Node:
    return Node(
        node_id=int(row.node_id),
        node_type=NodeType(row.node_type),
        hostname=row.hostname,
        endpoints=tuple(Endpoint(name=e["name"], address=e["address"]) for e in row.endpoints),
        status=NodeStatus(row.status),
        enabled=bool(row.enabled),
        tags=dict(row.tags),
        registered_at=float(row.registered_at),
    )


def _get_node(s: Session, node_id: int) -> Node:
    """The node ``node_id``; NotFoundError when it never registered."""
    row = s.execute(select(nodes).where(nodes.c.node_id == node_id)).first()
    if row is None:
        raise NotFoundError(f"node {node_id} is not registered")
    return _node(row)


def list_nodes(s: Session) -> list[Node]:
    """Every registered node, alive or dead, by id."""
    return [_node(r) for r in s.execute(select(nodes).order_by(nodes.c.node_id)).all()]


def register_node(s: Session, fence: Fence, reg: NodeRegistration, now: float) -> tuple[Node, int]:
    """Insert or refresh a node; it becomes alive. Returns the node and the routing version.

    Raises:
        NotPrimary: ``fence`` no longer holds the lease.
        Conflict: the id is registered with another node type, or was removed from the cluster.
        NoFreeId: ``reg.node_id`` is 0 and every id is taken.
    """
    check_fence(s, fence)
    values = {
        "node_type": int(reg.node_type),
        "hostname": reg.hostname,
        "endpoints": [{"name": e.name, "address": e.address} for e in reg.endpoints],
        "tags": reg.tags,
        "status": int(NodeStatus.ALIVE),
    }
    node_id = reg.node_id
    existing = s.execute(select(nodes).where(nodes.c.node_id == node_id)).first() if node_id else None
    if existing is not None:
        if existing.node_type != int(reg.node_type):
            raise Conflict(
                f"node {node_id} is registered as {NodeType(existing.node_type).name}, not {reg.node_type.name}"
            )
        s.execute(update(nodes).where(nodes.c.node_id == node_id).values(**values))
    else:
        if node_id:
            _refuse_removed(s, node_id)
        else:
            node_id = _next_node_id(s)
        s.execute(insert(nodes).values(node_id=node_id, enabled=True, registered_at=now, **values))
    version = bump_routing_version(s)
    return _get_node(s, node_id), version


def _refuse_removed(s: Session, node_id: int) -> None:
    """Conflict when ``node_id`` was removed: its machine must register anew (node id 0) to come back."""
    gone = s.execute(select(removed_nodes).where(removed_nodes.c.node_id == node_id)).first()
    if gone is not None:
        raise Conflict(
            f"node {node_id} ({gone.hostname}) was removed from the cluster; its id is not reused: register "
            "with node_id 0 to join as a new node"
        )


def _next_node_id(s: Session) -> int:
    """An id mgmtd assigns: from AUTO_NODE_ID_BASE up, the largest ever registered there (removed ones included) + 1.

    Past MAX_ID, the lowest never used from AUTO_NODE_ID_BASE up. Ids below the base are the deployer's.
    """
    top = max(
        int(s.execute(select(func.max(t.c.node_id)).where(t.c.node_id >= AUTO_NODE_ID_BASE)).scalar() or 0)
        for t in (nodes, removed_nodes)
    )
    if top < MAX_ID:
        return max(top + 1, AUTO_NODE_ID_BASE)
    taken = [*s.execute(select(nodes.c.node_id)).scalars(), *s.execute(select(removed_nodes.c.node_id)).scalars()]
    return lowest_free_id((int(n) for n in taken), MAX_ID, start=AUTO_NODE_ID_BASE)


def remove_node(s: Session, fence: Fence, node_id: int, now: float, lease_duration_s: float) -> NodeRemoval:
    """Forget a node that left: its row goes, a tombstone keeps its id from reuse, the routing version moves.

    A node removed before is answered as removed again (nothing changes).

    Raises:
        NotPrimary: ``fence`` no longer holds the lease.
        NotFoundError: the node never registered.
        Conflict: the node is alive, enabled, or holds chain targets (``core.removal``): nothing changes.
    """
    check_fence(s, fence)
    row = s.execute(select(nodes).where(nodes.c.node_id == node_id)).first()
    if row is None:
        removed_at = s.execute(select(removed_nodes.c.removed_at).where(removed_nodes.c.node_id == node_id)).scalar()
        if removed_at is None:
            raise NotFoundError(f"node {node_id} is not registered")
        return NodeRemoval(
            node_id=node_id, removed_at=float(removed_at), routing_version=routing_version(s), already_removed=True
        )
    node = _node(row)
    held = s.execute(
        select(chain_targets.c.target_id, chain_targets.c.chain_id)
        .where(chain_targets.c.node_id == node_id)
        .order_by(chain_targets.c.target_id)
    ).all()
    refusals = removal_refusals(node, [(int(t), int(c)) for t, c in held], lease_duration_s)
    if refusals:
        raise Conflict(f"node {node_id} cannot be removed: {'; '.join(refusals)}")
    s.execute(delete(nodes).where(nodes.c.node_id == node_id))
    s.execute(
        insert(removed_nodes).values(
            node_id=node_id, node_type=int(node.node_type), hostname=node.hostname, removed_at=now
        )
    )
    return NodeRemoval(node_id=node_id, removed_at=now, routing_version=bump_routing_version(s))


def mark_dead(s: Session, fence: Fence, node_ids: Sequence[int]) -> int | None:
    """Declare nodes dead (lease over). Returns the new routing version, or None if nothing changed."""
    check_fence(s, fence)
    alive = nodes.c.status == int(NodeStatus.ALIVE)
    dying = s.execute(select(nodes.c.node_id).where(nodes.c.node_id.in_(node_ids), alive)).scalars().all()
    if not dying:
        return None
    s.execute(update(nodes).where(nodes.c.node_id.in_(dying)).values(status=int(NodeStatus.DEAD)))
    return bump_routing_version(s)


def revive(s: Session, fence: Fence, node_id: int) -> tuple[Node, int]:
    """A heartbeat from a node declared dead: it is alive again (no re-registration needed)."""
    check_fence(s, fence)
    node = _get_node(s, node_id)
    if node.status is NodeStatus.ALIVE:
        return node, routing_version(s)
    s.execute(update(nodes).where(nodes.c.node_id == node_id).values(status=int(NodeStatus.ALIVE)))
    return _get_node(s, node_id), bump_routing_version(s)


def set_node_enabled(s: Session, fence: Fence, node_id: int, enabled: bool) -> tuple[Node, int]:
    """Enable or disable a node (admin). Returns the node and the routing version (unchanged when it was so).

    Raises:
        NotPrimary: ``fence`` no longer holds the lease.
        NotFoundError: the node never registered.
    """
    check_fence(s, fence)
    node = _get_node(s, node_id)
    if node.enabled == enabled:
        return node, routing_version(s)
    s.execute(update(nodes).where(nodes.c.node_id == node_id).values(enabled=enabled))
    return _get_node(s, node_id), bump_routing_version(s)


def list_chains(s: Session) -> list[Chain]:
    """Every chain by id, its targets head first."""
    versions = dict(s.execute(select(chains.c.chain_id, chains.c.version)).all())
    members: dict[int, list[ChainTarget]] = {int(c): [] for c in versions}
    for r in s.execute(select(chain_targets).order_by(chain_targets.c.chain_id, chain_targets.c.position)).all():
        members[int(r.chain_id)].append(
            ChainTarget(
                target_id=int(r.target_id),
                node_id=int(r.node_id),
                public_state=PublicTargetState(r.public_state),
                local_state=LocalTargetState(r.local_state),
            )
        )
    return [Chain(chain_id=c, version=int(versions[c]), targets=tuple(members[c])) for c in sorted(versions)]


def set_chains(s: Session, fence: Fence, wanted: Sequence[Chain]) -> tuple[list[Chain], int]:
    """Replace chains by compare-and-set on each chain's version (0 creates).

    Returns the stored chains (version + 1) and the new routing version.

    Raises:
        NotPrimary: ``fence`` no longer holds the lease.
        StaleVersion: a chain's version is not the stored one.
        NotFoundError: a target's node never registered.
        Conflict: a target already belongs to a chain this call does not replace.
    """
    check_fence(s, fence)
    stored = {c.chain_id: c for c in list_chains(s)}
    known_nodes = set(s.execute(select(nodes.c.node_id)).scalars().all())
    owner = {t.target_id: c.chain_id for c in stored.values() for t in c.targets}
    for chain in wanted:
        have = stored.get(chain.chain_id)
        if (have.version if have else 0) != chain.version:
            raise StaleVersion(
                f"chain {chain.chain_id}: version {chain.version} is stale (current {have.version if have else 0})"
            )
        for t in chain.targets:
            if t.node_id not in known_nodes:
                raise NotFoundError(f"chain {chain.chain_id}: node {t.node_id} is not registered")
            other = owner.get(t.target_id)
            if other is not None and other != chain.chain_id and other not in {c.chain_id for c in wanted}:
                raise Conflict(f"target {t.target_id} already belongs to chain {other}")
    for chain in wanted:
        s.execute(delete(chain_targets).where(chain_targets.c.chain_id == chain.chain_id))
    for chain in wanted:
        if chain.chain_id in stored:
            s.execute(update(chains).where(chains.c.chain_id == chain.chain_id).values(version=chain.version + 1))
        else:
            s.execute(insert(chains).values(chain_id=chain.chain_id, version=1))
        for position, t in enumerate(chain.targets):
            s.execute(
                insert(chain_targets).values(
                    target_id=t.target_id,
                    chain_id=chain.chain_id,
                    position=position,
                    node_id=t.node_id,
                    public_state=int(t.public_state),
                    local_state=int(t.local_state),
                )
            )
    version = bump_routing_version(s)
    updated = {c.chain_id: c for c in list_chains(s)}
    return [updated[c.chain_id] for c in wanted], version


def _list_chain_tables(s: Session) -> list[ChainTable]:
    """Every chain table by id."""
    rows = s.execute(select(chain_tables).order_by(chain_tables.c.table_id)).all()
    return [ChainTable(table_id=int(r.table_id), version=int(r.version), chain_ids=tuple(r.chain_ids)) for r in rows]


def set_chain_table(s: Session, fence: Fence, table: ChainTable) -> tuple[ChainTable, int]:
    """Create or replace a chain table by compare-and-set on its version (0 creates).

    Returns the stored table and the new routing version.

    Raises:
        NotPrimary: ``fence`` no longer holds the lease.
        StaleVersion: ``table.version`` is not the stored one.
        NotFoundError: the table names a chain that does not exist.
    """
    check_fence(s, fence)
    have = s.execute(select(chain_tables.c.version).where(chain_tables.c.table_id == table.table_id)).scalar()
    current = int(have) if have is not None else 0
    if current != table.version:
        raise StaleVersion(f"chain table {table.table_id}: version {table.version} is stale (current {current})")
    known = set(s.execute(select(chains.c.chain_id)).scalars().all())
    missing = sorted(set(table.chain_ids) - known)
    if missing:
        raise NotFoundError(f"chain table {table.table_id}: unknown chain(s) {missing}")
    values = {"version": current + 1, "chain_ids": list(table.chain_ids)}
    if have is None:
        s.execute(insert(chain_tables).values(table_id=table.table_id, **values))
    else:
        s.execute(update(chain_tables).where(chain_tables.c.table_id == table.table_id).values(**values))
    saved = ChainTable(table_id=table.table_id, version=current + 1, chain_ids=table.chain_ids)
    return saved, bump_routing_version(s)


def routing_info(s: Session, now: float) -> RoutingInfo:
    """The whole routing view as stored, read in one transaction so its parts agree with its version."""
    return RoutingInfo(
        version=routing_version(s),
        cluster_id=get_cluster_id(s),
        nodes=tuple(list_nodes(s)),
        chains=tuple(list_chains(s)),
        chain_tables=tuple(_list_chain_tables(s)),
    )


def get_config(s: Session, node_type: NodeType) -> ConfigEntry:
    """The stored config of ``node_type``; version 0 and empty content when none was ever set."""
    row = s.execute(select(configs).where(configs.c.node_type == int(node_type))).first()
    if row is None:
        return ConfigEntry(node_type=node_type, version=0, content="")
    return ConfigEntry(node_type=node_type, version=int(row.version), content=row.content)


def config_versions(s: Session) -> dict[NodeType, int]:
    """The config version of every node type that has a config."""
    return {NodeType(t): int(v) for t, v in s.execute(select(configs.c.node_type, configs.c.version))}


def set_config(s: Session, fence: Fence, node_type: NodeType, expected_version: int, content: str, now: float) -> int:
    """Store a node type's config by compare-and-set on its version; returns the new version.

    Raises:
        NotPrimary: ``fence`` no longer holds the lease.
        StaleVersion: ``expected_version`` is not the stored one.
    """
    check_fence(s, fence)
    current = get_config(s, node_type)
    if current.version != expected_version:
        raise StaleVersion(
            f"config of {node_type.name}: version {expected_version} is stale (current {current.version})"
        )
    version = current.version + 1
    values = {"version": version, "content": content, "updated_at": now}
    if current.version == 0:
        s.execute(insert(configs).values(node_type=int(node_type), **values))
    else:
        s.execute(update(configs).where(configs.c.node_type == int(node_type)).values(**values))
    return version


def _check_positive_id(kind: str, value: int) -> int:
    if value <= 0:
        raise InvalidRequest(f"{kind} must be positive")
    return value


def apply_chain_scan(s: Session, fence: Fence, changes: Sequence[tuple[int, Chain]]) -> int | None:
    """Store what a chain scan decided: each ``(version it was computed from, new chain)``.

    A chain whose stored version moved since (an admin SetChains) is skipped: the next scan redoes it.
    Returns the new routing version, or None when nothing was stored.
    """
    check_fence(s, fence)
    stored = dict(s.execute(select(chains.c.chain_id, chains.c.version)).all())
    stored_ids = {int(k): int(v) for k, v in stored.items()}
    applied = 0
    for base_version, chain in changes:
        if stored_ids.get(chain.chain_id) != base_version:
            continue
        s.execute(update(chains).where(chains.c.chain_id == chain.chain_id).values(version=chain.version))
        s.execute(delete(chain_targets).where(chain_targets.c.chain_id == chain.chain_id))
        for position, t in enumerate(chain.targets):
            s.execute(
                insert(chain_targets).values(
                    target_id=t.target_id,
                    chain_id=chain.chain_id,
                    position=position,
                    node_id=t.node_id,
                    public_state=int(t.public_state),
                    local_state=int(t.local_state),
                )
            )
        applied += 1
    return bump_routing_version(s) if applied else None


def find_target_chain(s: Session, target_id: int) -> Chain:
    """The chain that holds ``target_id``; NotFoundError when no chain does."""
    row = s.execute(select(chain_targets.c.chain_id).where(chain_targets.c.target_id == target_id)).first()
    if row is None:
        raise NotFoundError(f"target {target_id} is in no chain")
    return next(c for c in list_chains(s) if c.chain_id == int(row.chain_id))
