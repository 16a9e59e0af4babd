"""What a start order becomes: checked fields and the environment of every local rank (HAI's names)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ff_agent.core.errors import InvalidRequest

# Names the hfai SDK reads (hfai.client, hfai.config, hfai.runcontrol).
TASK_ID_ENV = "MARSV2_TASK_ID"
RUN_ID_ENV = "MARSV2_RUN_ID"
WHOLE_LIFE_STATE_ENV = "MARSV2_WHOLE_LIFE_STATE"
PRIORITY_ENV = "MARSV2_PRIORITY"
RUN_DIR_ENV = "HFAI_RUN_DIR"
TOKEN_ENV = "HFAI_TOKEN"
SERVER_ENV = "HFAI_SERVER"
MGMTD_ENV = "HFAI_MGMTD"
# Where a rank writes its error file (the rank hook's excepthook), and which device slot it owns.
ERROR_FILE_ENV = "FF_RANK_ERROR_FILE"
DEVICE_ENV = "FF_DEVICE_INDEX"
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"

MAX_RANKS_PER_NODE = 256
# Variables of the agent that never reach a task (its own settings and secrets).
_PRIVATE_PREFIXES = ("FF_AGENT_",)


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


@dataclass(frozen=True, kw_only=True)
class NodeFacts:
    """What the agent knows of its node and the cluster, for the ranks' environment."""

    device_indices: tuple[int, ...]
    gpus: bool
    scheduler_address: str = ""
    mgmtd_addresses: str = ""


@dataclass(frozen=True, kw_only=True)
class RankPlan:
    local_rank: int
    env: dict[str, str]


def check_order(order: StartOrder, node: NodeFacts) -> tuple[int, ...]:
    """The devices the run uses on this node; InvalidRequest for anything that must not launch."""
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
    return {k: v for k, v in base.items() if not k.startswith(_PRIVATE_PREFIXES)}


def plan_ranks(
    order: StartOrder,
    node: NodeFacts,
    devices: Sequence[int],
    *,
    base_env: Mapping[str, str],
    run_dir: str,
    error_dir: str,
    hook_dir: str,
) -> list[RankPlan]:
    """One entry per local rank with its full environment (the agent's variables win over the task's)."""
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
        "PYTHONUNBUFFERED": "1",
    }
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
        plans.append(RankPlan(local_rank=local_rank, env=env))
    return plans
