"""What a start order becomes: checked fields and the environment of every local rank (HAI's names)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from ff_agent.core.errors import CannotRunAs, InvalidRequest
from hfreduce.config import CONTROL_FILE_ENV, ENV_PREFIX

# Names the hfai SDK reads (hfai.client, hfai.config, hfai.runcontrol).
TASK_ID_ENV = "MARSV2_TASK_ID"
RUN_ID_ENV = "MARSV2_RUN_ID"
WHOLE_LIFE_STATE_ENV = "MARSV2_WHOLE_LIFE_STATE"
PRIORITY_ENV = "MARSV2_PRIORITY"
RUN_DIR_ENV = "HFAI_RUN_DIR"
TOKEN_ENV = "HFAI_TOKEN"
SERVER_ENV = "HFAI_SERVER"
MGMTD_ENV = "HFAI_MGMTD"
# The cluster's client variables every tool reads (hf3fs.connect(), the hf3fs and fireflyer CLIs, hfai).
FF_MGMTD_ENV = "FF_MGMTD_ADDRESSES"
FF_TOKEN_ENV = "FF_TOKEN"
# Where a rank writes its error file (the rank hook's excepthook), and which device slot it owns.
ERROR_FILE_ENV = "FF_RANK_ERROR_FILE"
DEVICE_ENV = "FF_DEVICE_INDEX"
# The labels every telemetry sample of a rank carries (JSON object; hfai.telemetry reads it, users cannot
# override it: the agent's variables win over the order's).
TELEMETRY_LABELS_ENV = "FF_TELEMETRY_LABELS"
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"

MAX_RANKS_PER_NODE = 256
# What one start order may carry (checked before anything else); a whole request is at most
# MAX_REQUEST_BYTES (larger: RESOURCE_EXHAUSTED before it is parsed).
MAX_REQUEST_BYTES = 4 << 20
MAX_COMMAND_BYTES = 256 * 1024  # argv and env together; Linux refuses one argument over 128 KiB anyway
MAX_ARG_BYTES = 128 * 1024
MAX_FIELD_CHARS = 4096  # master_ip, working_dir, token, user_name
# Variables of the agent that never reach a task (its own settings and secrets, any service's cluster
# token); the client variables above are the run's own, set below, never the agent's.
_PRIVATE_PREFIXES = ("FF_AGENT_",)
_PRIVATE_PARTS = ("CLUSTER_TOKEN",)
_PRIVATE_NAMES = frozenset({FF_TOKEN_ENV, TOKEN_ENV})


class RanksRunAs(StrEnum):
    """Whose uid a run's ranks get: the task's user (needs root) or the agent's own (no isolation).

    ``auto`` is resolved at start to one of the two.
    """

    TASK_USER = "task-user"
    AGENT_USER = "agent-user"
    AUTO = "auto"


@dataclass(frozen=True, kw_only=True)
class Owner:
    """Who a run's token belongs to, as the identity registry answered for it."""

    uid: int
    name: str
    gids: tuple[int, ...] = ()
    is_cluster: bool = False


@dataclass(frozen=True, kw_only=True)
class RunAs:
    """The credentials of a run's ranks: the owner's uid, primary gid and groups."""

    uid: int
    gid: int
    groups: tuple[int, ...]
    user_name: str


def ranks_user(order_user: str, owner: Owner, *, mode: RanksRunAs, agent_uid: int) -> RunAs | None:
    """Whose credentials the ranks get; None: the agent's own.

    None when the agent is not root and the owner is it, or when the agent is configured to run every rank as
    itself.

    Raises:
        InvalidRequest: the token is the cluster's or root's, or not the task owner's.
        CannotRunAs: the agent is not root and the owner is another uid (it cannot switch to it).
    """
    if owner.is_cluster or owner.uid == 0:
        raise InvalidRequest("token: a task runs with its user's token, never the cluster's or root's")
    if order_user and owner.name != order_user:
        raise InvalidRequest(f"token: it belongs to {owner.name!r}, not to the task's user {order_user!r}")
    if mode is not RanksRunAs.TASK_USER or (agent_uid != 0 and owner.uid == agent_uid):
        return None
    if agent_uid != 0:
        raise CannotRunAs(
            f"this agent runs as uid {agent_uid}, not root: it cannot run the ranks of {owner.name!r} "
            f"(uid {owner.uid}) as their user (the operator may set ranks_run_as=agent-user)"
        )
    # The primary group as meta takes it: the first group, else the user's private group (gid = uid).
    gid = owner.gids[0] if owner.gids else owner.uid
    return RunAs(uid=owner.uid, gid=gid, groups=owner.gids, user_name=owner.name)


@dataclass(frozen=True, kw_only=True)
class StartOrder:
    """A start order as the scheduler sent it (domain copy of agent.v1.StartRunRequest)."""

    task_id: int
    run_id: int
    run_index: int = 0
    user_name: str = ""
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    working_dir: str = ""
    node_rank: int
    num_nodes: int
    master_ip: str
    master_port: int
    ranks_per_node: int = 0
    device_indices: tuple[int, ...] = ()
    whole_life_state: int = 0
    token: str = ""
    priority: int = 0


ZONE_ENV = ENV_PREFIX + "ZONE"


@dataclass(frozen=True, kw_only=True)
class NodeFacts:
    """What the agent knows of its node and the cluster, for the ranks' environment."""

    device_indices: tuple[int, ...]
    gpus: bool
    scheduler_address: str = ""
    mgmtd_addresses: str = ""
    hostname: str = ""
    zone: str = ""  # the node's network zone: hfreduce orders nodes zone by zone, so its trees cross zones once


@dataclass(frozen=True, kw_only=True)
class RankPlan:
    """How to start one local rank: its number and its full environment."""

    local_rank: int
    env: dict[str, str]


def check_sizes(order: StartOrder) -> None:
    """Bounds on what an order may make the agent hold or pass to exec (before anything else)."""
    if len(order.device_indices) > MAX_RANKS_PER_NODE:
        raise InvalidRequest(f"device_indices: at most {MAX_RANKS_PER_NODE}")
    if any(len(a.encode()) > MAX_ARG_BYTES for a in order.argv):
        raise InvalidRequest(f"argv: an argument is over {MAX_ARG_BYTES} bytes")
    size = sum(len(a.encode()) + 1 for a in order.argv) + sum(len(k) + len(v) + 2 for k, v in order.env.items())
    if size > MAX_COMMAND_BYTES:
        raise InvalidRequest(f"argv and env are {size} bytes; the limit is {MAX_COMMAND_BYTES}")
    for name in ("master_ip", "working_dir", "token", "user_name"):
        if len(getattr(order, name)) > MAX_FIELD_CHARS:
            raise InvalidRequest(f"{name}: at most {MAX_FIELD_CHARS} characters")


def check_order(order: StartOrder, node: NodeFacts) -> tuple[int, ...]:
    """The devices the run uses on this node; InvalidRequest for anything that must not launch."""
    check_sizes(order)
    if order.task_id <= 0 or order.run_id <= 0:
        raise InvalidRequest("task_id and run_id are required")
    if not order.argv or not order.argv[0].strip():
        raise InvalidRequest("argv: the command is empty")
    if any("\0" in a for a in order.argv):
        raise InvalidRequest("argv: NUL byte in an argument")
    if not order.token:
        raise InvalidRequest("token: the run has no token (the task could not call the services)")
    if order.num_nodes < 1 or order.node_rank >= order.num_nodes:
        raise InvalidRequest(f"node_rank {order.node_rank} is not below num_nodes {order.num_nodes}")
    if not order.master_ip or not 0 < order.master_port < 65536:
        raise InvalidRequest("master_ip and master_port (1..65535) are required")
    unknown = sorted(set(order.device_indices) - set(node.device_indices))
    if unknown:
        raise InvalidRequest(f"device_indices: this node has no devices {unknown} (it has {list(node.device_indices)})")
    if len(set(order.device_indices)) != len(order.device_indices):
        raise InvalidRequest("device_indices: repeated device")
    devices = order.device_indices or node.device_indices
    if not devices:
        raise InvalidRequest("this node has no devices")
    if order.ranks_per_node > MAX_RANKS_PER_NODE:
        raise InvalidRequest(f"ranks_per_node: at most {MAX_RANKS_PER_NODE}")
    for key in order.env:
        if not key or "=" in key or "\0" in key or "\0" in order.env[key]:
            raise InvalidRequest(f"env: bad variable name or value {key!r}")
    return tuple(devices)


def task_env(base: Mapping[str, str]) -> dict[str, str]:
    """The agent's own environment minus what is private to it."""
    return {
        k: v
        for k, v in base.items()
        if not k.startswith(_PRIVATE_PREFIXES) and k not in _PRIVATE_NAMES and not any(p in k for p in _PRIVATE_PARTS)
    }


def plan_ranks(
    order: StartOrder,
    node: NodeFacts,
    devices: Sequence[int],
    *,
    base_env: Mapping[str, str],
    run_dir: str,
    error_dir: str,
    hook_dir: str,
    collective_file: str = "",
) -> list[RankPlan]:
    """One entry per local rank with its full environment (the agent's variables win over the task's).

    ``collective_file``: where a group the ranks form through a store writes its control server's address
    (``FF_HFREDUCE_CONTROL_FILE``), for hang detection; empty: not asked.
    """
    num_local = order.ranks_per_node or len(devices)
    one_per_device = num_local == len(devices)
    common = {
        **task_env(base_env),
        **order.env,
        "WORLD_SIZE": str(order.num_nodes),
        "RANK": str(order.node_rank),
        "MASTER_IP": order.master_ip,
        "MASTER_ADDR": order.master_ip,
        "MASTER_PORT": str(order.master_port),
        "LOCAL_WORLD_SIZE": str(num_local),
        TASK_ID_ENV: str(order.task_id),
        RUN_ID_ENV: str(order.run_id),
        WHOLE_LIFE_STATE_ENV: str(order.whole_life_state),
        PRIORITY_ENV: str(order.priority),
        RUN_DIR_ENV: run_dir,
        TOKEN_ENV: order.token,
        SERVER_ENV: node.scheduler_address,
        MGMTD_ENV: node.mgmtd_addresses,
        FF_TOKEN_ENV: order.token,
        FF_MGMTD_ENV: node.mgmtd_addresses,
        "PYTHONUNBUFFERED": "1",
    }
    if collective_file:
        common[CONTROL_FILE_ENV] = collective_file
    if node.zone:  # the placement fact hfreduce builds its trees from (the scheduler gives node ranks zone by zone)
        common[ZONE_ENV] = node.zone
    user_path = order.env.get("PYTHONPATH") or base_env.get("PYTHONPATH", "")
    common["PYTHONPATH"] = hook_dir + (":" + user_path if user_path else "")
    plans = []
    for local_rank in range(num_local):
        env = dict(common)
        env["LOCAL_RANK"] = str(local_rank)
        env[ERROR_FILE_ENV] = f"{error_dir}/rank{local_rank}.json"
        visible = [devices[local_rank]] if one_per_device else list(devices)
        env[DEVICE_ENV] = ",".join(str(d) for d in visible)
        if node.gpus:
            env[CUDA_VISIBLE_DEVICES] = env[DEVICE_ENV]
        env[TELEMETRY_LABELS_ENV] = json.dumps(telemetry_labels(order, node, local_rank, num_local))
        plans.append(RankPlan(local_rank=local_rank, env=env))
    return plans


def telemetry_labels(order: StartOrder, node: NodeFacts, local_rank: int, num_local: int) -> dict[str, str]:
    """Who a rank's samples come from: task, run, node rank, global rank, local rank and node.

    The global rank is node rank x local world size + local rank.
    """
    return {
        "task_id": str(order.task_id),
        "run_id": str(order.run_id),
        "node_rank": str(order.node_rank),
        "rank": str(order.node_rank * num_local + local_rank),
        "local_rank": str(local_rank),
        "node": node.hostname,
    }
