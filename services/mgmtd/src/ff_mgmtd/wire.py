"""Translation between protobuf messages and mgmtd's domain types (no rules here)."""

from __future__ import annotations

from ff_mgmtd.core.model import (
    Chain,
    ChainTable,
    ChainTarget,
    Endpoint,
    Group,
    LocalTargetState,
    MgmtdInstance,
    Node,
    PublicTargetState,
    RoutingInfo,
    TokenInfo,
    User,
)
from fireflyer.common.v1 import common_pb2
from fireflyer.mgmtd.v1 import mgmtd_pb2 as pb


def endpoints_from_proto(msgs: list[common_pb2.Endpoint]) -> list[Endpoint]:
    """Endpoints as a caller sent them (checked later, by ``validation.check_registration``)."""
    return [Endpoint(name=e.name, address=e.address) for e in msgs]


def node_to_proto(node: Node, last_heartbeat_at: float = 0.0) -> pb.Node:
    """A node as routing info shows it; ``last_heartbeat_at`` in epoch seconds, 0 when not known."""
    return pb.Node(
        node_id=node.node_id,
        node_type=common_pb2.NodeType.ValueType(node.node_type),
        hostname=node.hostname,
        endpoints=[common_pb2.Endpoint(name=e.name, address=e.address) for e in node.endpoints],
        status=pb.NodeStatus.ValueType(node.status),
        enabled=node.enabled,
        tags=node.tags,
        registered_at=node.registered_at,
        last_heartbeat_at=last_heartbeat_at,
    )


def chain_to_proto(chain: Chain) -> pb.Chain:
    """A chain with its targets head first, each tagged with the chain's id."""
    return pb.Chain(
        chain_id=chain.chain_id,
        version=chain.version,
        targets=[
            pb.Target(
                target_id=t.target_id,
                node_id=t.node_id,
                chain_id=chain.chain_id,
                public_state=pb.PublicTargetState.ValueType(t.public_state),
                local_state=pb.LocalTargetState.ValueType(t.local_state),
            )
            for t in chain.targets
        ],
    )


def chain_from_proto(msg: pb.Chain) -> Chain:
    """Unspecified target states mean a fresh target: serving and up to date."""
    return Chain(
        chain_id=msg.chain_id,
        version=msg.version,
        targets=tuple(
            ChainTarget(
                target_id=t.target_id,
                node_id=t.node_id,
                public_state=PublicTargetState(t.public_state or PublicTargetState.SERVING),
                local_state=LocalTargetState(t.local_state or LocalTargetState.UPTODATE),
            )
            for t in msg.targets
        ),
    )


def chain_table_to_proto(table: ChainTable) -> pb.ChainTable:
    """A chain table for the wire."""
    return pb.ChainTable(table_id=table.table_id, version=table.version, chain_ids=table.chain_ids)


def chain_table_from_proto(msg: pb.ChainTable) -> ChainTable:
    """A chain table a caller sent (checked later, by ``validation.check_chain_table``)."""
    return ChainTable(table_id=msg.table_id, version=msg.version, chain_ids=tuple(msg.chain_ids))


def routing_to_proto(info: RoutingInfo, last_heartbeat: dict[int, float]) -> pb.RoutingInfo:
    """The whole routing view, each node with its last heartbeat (epoch seconds) from ``last_heartbeat``."""
    return pb.RoutingInfo(
        version=info.version,
        cluster_id=info.cluster_id,
        nodes=[node_to_proto(n, last_heartbeat.get(n.node_id, 0.0)) for n in info.nodes],
        chains=[chain_to_proto(c) for c in info.chains],
        chain_tables=[chain_table_to_proto(t) for t in info.chain_tables],
    )


def instance_to_proto(inst: MgmtdInstance) -> pb.MgmtdInstance:
    """An mgmtd instance for ListMgmtdInstances."""
    return pb.MgmtdInstance(
        instance_id=inst.instance_id,
        address=inst.address,
        is_primary=inst.is_primary,
        last_seen_at=inst.last_seen_at,
    )


def user_to_proto(user: User) -> pb.User:
    """A user with its role and groups."""
    return pb.User(
        uid=user.uid,
        name=user.name,
        role=common_pb2.Role.ValueType(user.role),
        disabled=user.disabled,
        group_names=user.group_names,
        created_at=user.created_at,
    )


def group_to_proto(group: Group) -> pb.Group:
    """A group with its members."""
    return pb.Group(gid=group.gid, name=group.name, member_names=group.member_names)


def token_to_proto(info: TokenInfo) -> pb.TokenInfo:
    """A token's public facts (never its secret)."""
    return pb.TokenInfo(
        token_id=info.token_id,
        user_name=info.user_name,
        description=info.description,
        created_at=info.created_at,
        expires_at=info.expires_at,
        revoked=info.revoked,
    )
