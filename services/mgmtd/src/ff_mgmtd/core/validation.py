"""Checks on what callers send; each failure is an InvalidRequest naming the field."""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Sequence

from ff_mgmtd.core.errors import InvalidRequest
from ff_mgmtd.core.model import Chain, ChainTable, Endpoint, LocalTargetState, NodeRegistration, NodeType

MAX_ID = 2**32 - 1  # node, chain, table, user and group ids are uint32 on the wire
MAX_POSIX_ID = 2**32 - 2  # a uid or gid: 2^32-1 is (uid_t)-1, "no change" to chown and setreuid
MAX_TARGET_ID = 2**63 - 1  # target ids are uint64 on the wire, stored as signed 64-bit
MAX_DESCRIPTION_CHARS = 256
_NAME_RE = re.compile(r"^[a-z_][a-z0-9_.-]{0,63}$")
_HOST_RE = re.compile(r"^[A-Za-z0-9_.:\-\[\]]{1,255}$")
_ADDRESS_RE = re.compile(r"^(\[[0-9a-fA-F:]+\]|[A-Za-z0-9_.\-]+):([0-9]{1,5})$")
MAX_TAGS = 64
MAX_CONFIG_BYTES = 1 << 20
# What one request may carry; checked before anything is converted or looked up. A whole request is at
# most MAX_REQUEST_BYTES (larger ones are RESOURCE_EXHAUSTED before they are parsed).
MAX_REQUEST_BYTES = 4 << 20
MAX_ENDPOINTS = 16
MAX_CHAINS_PER_CALL = 4096
MAX_TARGETS_PER_CHAIN = 16
MAX_TABLE_CHAINS = 65536
MAX_GROUPS_PER_USER = 256
MAX_TOKEN_TTL_S = 10 * 365 * 24 * 3600.0
MAX_TOKEN_ID_CHARS = 64


def check_count(field: str, count: int, most: int) -> None:
    """A repeated field's length, checked before its entries are looked at."""
    if count > most:
        raise InvalidRequest(f"{field}: at most {most} entries, got {count}")


def check_target_id(field: str, target_id: int) -> int:
    """A target id as stored (signed 64-bit): 1..2^63-1."""
    if not 0 < target_id <= MAX_TARGET_ID:
        raise InvalidRequest(f"{field} {target_id} must be in 1..{MAX_TARGET_ID}")
    return target_id


def check_posix_id(field: str, value: int) -> int:
    """A uid or gid given by a caller: 0 (assign the next free one) or 1..2^32-2."""
    if value > MAX_POSIX_ID:
        raise InvalidRequest(f"{field} {value} must be in 1..{MAX_POSIX_ID} (0: the next free one)")
    return value


def check_name(kind: str, name: str) -> str:
    """User and group names: lowercase POSIX-like, at most 64 characters."""
    if not _NAME_RE.match(name):
        raise InvalidRequest(f"{kind} name {name!r} must match {_NAME_RE.pattern}")
    return name


def check_new_user_name(name: str, reserved: Collection[str]) -> str:
    """A name for a new user: ``check_name``, and none of the ``reserved`` names.

    The reserved names are the principal the cluster's services act under, which some checks compare by name.
    """
    check_name("user", name)
    if name in reserved:
        raise InvalidRequest(f"user name {name!r} is reserved for the cluster's services")
    return name


def check_node_type(value: int) -> NodeType:
    """A node type number from the wire, as a ``NodeType``; InvalidRequest for 0 or an unknown one."""
    try:
        return NodeType(value)
    except ValueError:
        raise InvalidRequest(f"node_type {value} is not a known node type") from None


def _check_address(field_name: str, address: str) -> str:
    match = _ADDRESS_RE.match(address)
    if match is None or not 0 < int(match.group(2)) < 65536:
        raise InvalidRequest(f"{field_name} {address!r} is not host:port")
    return address


def check_registration(
    node_id: int, node_type: int, hostname: str, endpoints: Sequence[Endpoint], tags: dict[str, str]
) -> NodeRegistration:
    """A RegisterNode request's fields, checked: hostname, endpoints (``host:port``, unique names) and tags.

    Raises:
        InvalidRequest: naming the first field that is wrong.
    """
    if not _HOST_RE.match(hostname):
        raise InvalidRequest(f"hostname {hostname!r} is empty or has characters a hostname cannot have")
    if not endpoints:
        raise InvalidRequest("endpoints: a node must have at least one endpoint")
    check_count("endpoints", len(endpoints), MAX_ENDPOINTS)
    names = [e.name for e in endpoints]
    if len(set(names)) != len(names) or not all(names):
        raise InvalidRequest("endpoints: names must be non-empty and unique")
    for e in endpoints:
        _check_address(f"endpoint {e.name!r}", e.address)
    if len(tags) > MAX_TAGS or any(not k or len(k) > 128 or len(v) > 1024 for k, v in tags.items()):
        raise InvalidRequest(f"tags: at most {MAX_TAGS}, keys 1-128 and values up to 1024 characters")
    return NodeRegistration(
        node_id=node_id,
        node_type=check_node_type(node_type),
        hostname=hostname,
        endpoints=tuple(endpoints),
        tags=dict(tags),
    )


def check_chains(chains: Sequence[Chain]) -> None:
    """Shape checks; existence of nodes and versions are checked against the store."""
    if not chains:
        raise InvalidRequest("chains: at least one chain")
    check_count("chains", len(chains), MAX_CHAINS_PER_CALL)
    seen_chains: set[int] = set()
    seen_targets: set[int] = set()
    for chain in chains:
        if not 0 < chain.chain_id <= MAX_ID:
            raise InvalidRequest(f"chain_id {chain.chain_id} must be in 1..{MAX_ID}")
        if chain.chain_id in seen_chains:
            raise InvalidRequest(f"chain {chain.chain_id} given twice")
        seen_chains.add(chain.chain_id)
        if not chain.targets:
            raise InvalidRequest(f"chain {chain.chain_id}: at least one target")
        check_count(f"chain {chain.chain_id}: targets", len(chain.targets), MAX_TARGETS_PER_CHAIN)
        for target in chain.targets:
            if not 0 < target.target_id <= MAX_TARGET_ID:
                raise InvalidRequest(f"chain {chain.chain_id}: target_id must be in 1..{MAX_TARGET_ID}")
            if target.target_id in seen_targets:
                raise InvalidRequest(f"target {target.target_id} appears in more than one place")
            seen_targets.add(target.target_id)


def check_chain_table(table: ChainTable) -> None:
    """A chain table's shape: an id in range and at least one chain, none twice (existence: the store's)."""
    if not 0 < table.table_id <= MAX_ID:
        raise InvalidRequest(f"table_id {table.table_id} must be in 1..{MAX_ID}")
    if not table.chain_ids:
        raise InvalidRequest("chain_ids: a chain table needs at least one chain")
    check_count("chain_ids", len(table.chain_ids), MAX_TABLE_CHAINS)
    if len(set(table.chain_ids)) != len(table.chain_ids):
        raise InvalidRequest("chain_ids: a chain may appear once in a table")


def check_config(content: str) -> str:
    """Config content is TOML text; it must parse, so a node never fetches a config it cannot load."""
    import tomllib

    if len(content.encode()) > MAX_CONFIG_BYTES:
        raise InvalidRequest(f"content: at most {MAX_CONFIG_BYTES} bytes")
    try:
        tomllib.loads(content)
    except tomllib.TOMLDecodeError as exc:
        raise InvalidRequest(f"content is not valid TOML: {exc}") from None
    return content


MAX_TARGET_REPORTS = 4096


def check_target_reports(reports: Sequence[tuple[int, int]]) -> dict[int, LocalTargetState]:
    """Heartbeat target reports: positive ids, each once, known local states."""
    if len(reports) > MAX_TARGET_REPORTS:
        raise InvalidRequest(f"targets: at most {MAX_TARGET_REPORTS} reports")
    states: dict[int, LocalTargetState] = {}
    for target_id, state in reports:
        if not 0 < target_id <= MAX_TARGET_ID or target_id in states:
            raise InvalidRequest(f"targets: target_id {target_id} is not in 1..{MAX_TARGET_ID} or is given twice")
        try:
            states[target_id] = LocalTargetState(state)
        except ValueError:
            raise InvalidRequest(f"targets: target {target_id} has unknown local state {state}") from None
    return states


def check_names(kind: str, names: Sequence[str]) -> list[str]:
    """A list of user or group names: each valid, none twice."""
    checked = [check_name(kind, n) for n in names]
    if len(set(checked)) != len(checked):
        raise InvalidRequest(f"{kind} names: a name may appear once")
    return checked


def check_description(text: str) -> str:
    """A token's description: printable, at most ``MAX_DESCRIPTION_CHARS`` characters."""
    if len(text) > MAX_DESCRIPTION_CHARS or not text.isprintable():
        raise InvalidRequest(f"description: at most {MAX_DESCRIPTION_CHARS} printable characters")
    return text


def check_ttl(ttl_s: float) -> float:
    """A token lifetime in seconds: 0 for none, else finite and positive."""
    if not math.isfinite(ttl_s) or not 0 <= ttl_s <= MAX_TOKEN_TTL_S:
        raise InvalidRequest(f"ttl_s must be in 0..{MAX_TOKEN_TTL_S:.0f} (0: the token does not expire)")
    return ttl_s
