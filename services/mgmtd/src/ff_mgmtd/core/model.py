"""mgmtd's domain types. The store and the servicer translate to and from these."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum


class NodeType(IntEnum):
    """Mirror of fireflyer.common.v1.NodeType (same numbers)."""

    MGMTD = 1
    META = 2
    STORAGE = 3
    SCHEDULER = 4
    AGENT = 5
    TELEMETRY = 6
    CLIENT = 7


class NodeStatus(IntEnum):
    """Whether a node holds its lease (mirror of mgmtd.v1.NodeStatus)."""

    ALIVE = 1
    DEAD = 2


class PublicTargetState(IntEnum):
    """A target's state in the chain as clients see it (3FS's public states; mirror of the proto)."""

    SERVING = 1
    SYNCING = 2
    WAITING = 3
    LASTSRV = 4
    OFFLINE = 5


class LocalTargetState(IntEnum):
    """A target's state as its storage node reports it (3FS's local states; mirror of the proto)."""

    UPTODATE = 1
    ONLINE = 2
    OFFLINE = 3


class Role(IntEnum):
    """What a user may do: ordinary calls, or administration too."""

    USER = 1
    ADMIN = 2


@dataclass(frozen=True, kw_only=True)
class Endpoint:
    """One named address a node serves on (``grpc``, ``data``, ``metrics``, ...)."""

    name: str
    address: str


@dataclass(frozen=True, kw_only=True)
class Node:
    """A registered node as routing info shows it; ``registered_at`` is epoch seconds."""

    node_id: int
    node_type: NodeType
    hostname: str
    endpoints: tuple[Endpoint, ...] = ()
    status: NodeStatus = NodeStatus.ALIVE
    enabled: bool = True
    tags: dict[str, str] = field(default_factory=dict)
    registered_at: float = 0.0


@dataclass(frozen=True, kw_only=True)
class NodeRemoval:
    """What RemoveNode did: the node is gone from routing at ``routing_version`` (``removed_at``: epoch seconds).

    ``already_removed``: an earlier call removed it; this one changed nothing.
    """

    node_id: int
    removed_at: float
    routing_version: int
    already_removed: bool = False


@dataclass(frozen=True, kw_only=True)
class NodeRegistration:
    """A RegisterNode request, validated."""

    node_id: int
    node_type: NodeType
    hostname: str
    endpoints: tuple[Endpoint, ...]
    tags: dict[str, str]


@dataclass(frozen=True, kw_only=True)
class ChainTarget:
    """One replica of a chain: the target, the node holding it and its two states."""

    target_id: int
    node_id: int
    public_state: PublicTargetState = PublicTargetState.SERVING
    local_state: LocalTargetState = LocalTargetState.UPTODATE


@dataclass(frozen=True, kw_only=True)
class Chain:
    """Targets head first, tail last."""

    chain_id: int
    version: int
    targets: tuple[ChainTarget, ...]


@dataclass(frozen=True, kw_only=True)
class ChainTable:
    """A versioned list of chains that files are striped over."""

    table_id: int
    version: int
    chain_ids: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class RoutingInfo:
    """The cluster's whole routing view at one version: nodes, chains and chain tables."""

    version: int
    cluster_id: str
    nodes: tuple[Node, ...]
    chains: tuple[Chain, ...]
    chain_tables: tuple[ChainTable, ...]


@dataclass(frozen=True, kw_only=True)
class ConfigEntry:
    """The stored config (TOML text) of one node type, at one version."""

    node_type: NodeType
    version: int
    content: str


@dataclass(frozen=True, kw_only=True)
class User:
    """A user of the identity registry with its role and groups (``created_at``: epoch seconds)."""

    uid: int
    name: str
    role: Role
    disabled: bool
    group_names: tuple[str, ...]
    gids: tuple[int, ...]
    created_at: float


@dataclass(frozen=True, kw_only=True)
class Group:
    """A group of the identity registry and its members."""

    gid: int
    name: str
    member_names: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class TokenInfo:
    """A token's public facts (never its secret); ``expires_at`` 0: never, times in epoch seconds."""

    token_id: str
    user_name: str
    description: str
    created_at: float
    expires_at: float
    revoked: bool


@dataclass(frozen=True, kw_only=True)
class MgmtdInstance:
    """One mgmtd instance as the election table knows it (``last_seen_at``: epoch seconds)."""

    instance_id: str
    address: str
    is_primary: bool
    last_seen_at: float
