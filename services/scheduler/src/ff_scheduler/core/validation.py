"""Checks of what users and agents send (pure; every failure is InvalidRequest and changes nothing)."""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from ff_scheduler.core import priority
from ff_scheduler.core.errors import InvalidRequest, NotFoundError

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
MAX_NAME_CHARS = 256
MAX_NODES = 100_000
# What one request may carry (checked before anything is converted or looked up); a whole request is at
# most MAX_REQUEST_BYTES (larger: RESOURCE_EXHAUSTED before it is parsed).
MAX_REQUEST_BYTES = 4 << 20
MAX_ROW_ID = 2**63 - 1  # task, run ids: uint64 on the wire, signed 64-bit in SQL
MAX_RANKS_PER_NODE = 256  # as the agent
MAX_PATH_CHARS = 4096
MAX_TAGS, MAX_TAG_CHARS = 64, 1024
MAX_IMAGE_CHARS = 1024
MAX_FILTER_VALUES = 16
MAX_HOST_CHARS = 255
MAX_DEVICES = 256
MAX_REPORTED_RUNS = 4096
MAX_CHECKS, MAX_CHECK_CHARS = 64, 64


def check_count(field_name: str, count: int, most: int) -> None:
    """A repeated field's length, checked before its entries are looked at."""
    if count > most:
        raise InvalidRequest(f"{field_name}: at most {most} entries, got {count}")


def check_length(field_name: str, text: str, most: int) -> str:
    """``text`` if it has at most ``most`` characters; InvalidRequest naming the field otherwise."""
    if len(text) > most:
        raise InvalidRequest(f"{field_name}: at most {most} characters, got {len(text)}")
    return text


def check_seconds(field_name: str, value: float) -> float:
    """A duration or time in seconds: finite and >= 0."""
    if not math.isfinite(value) or value < 0:
        raise InvalidRequest(f"{field_name} must be a finite number >= 0, got {value}")
    return value


def existing_id(field_name: str, value: int) -> int:
    """A task or run id given by a caller: required, and NOT_FOUND past what SQL stores (2^63-1)."""
    if value <= 0:
        raise InvalidRequest(f"{field_name} is required")
    if value > MAX_ROW_ID:
        raise NotFoundError(f"{field_name} {value} does not exist")
    return value


def check_enum_values(field_name: str, values: Iterable[int], kind: type[enum.IntEnum]) -> list[int]:
    """A filter on enum values: each known, at most MAX_FILTER_VALUES."""
    listed = list(values)
    check_count(field_name, len(listed), MAX_FILTER_VALUES)
    known = {int(v) for v in kind}
    unknown = sorted(set(listed) - known)
    if unknown:
        raise InvalidRequest(f"{field_name}: unknown values {unknown[:8]}")
    return listed


@dataclass(frozen=True, kw_only=True)
class Limits:
    """Limits from the service's settings."""

    max_command_bytes: int = 64 * 1024
    default_group: str = "default"
    default_priority: int = priority.NORMAL
    default_watchdog_time_s: float = 1800.0
    default_max_restarts: int = 3
    max_restarts: int = 100


@dataclass(frozen=True, kw_only=True)
class TaskRequest:
    """A submission as the servicer decoded it."""

    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    working_dir: str = ""
    num_nodes: int
    priority: int | None = None
    auto_priority: bool = False
    node_group: str = ""
    ranks_per_node: int = 0
    watchdog_time_s: float = 0.0
    max_restarts: int | None = None
    suspend_grace_s: float = 0.0
    image: str = ""
    whole_life_state: int = 0
    tags: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class CheckedTask:
    """A submission after ``check_task``: the fields the store keeps, each checked."""

    name: str
    spec: dict[str, object]
    num_nodes: int
    asked_priority: int | None
    node_group: str
    watchdog_time_s: float
    max_restarts: int
    suspend_grace_s: float
    whole_life_state: int


def check_level(value: int) -> int:
    """``value`` if it is a priority level; InvalidRequest otherwise."""
    if not priority.is_level(value):
        raise InvalidRequest(f"priority {value} is out of range; levels: {priority.describe_levels()} (or AUTO)")
    return value


def check_priority_choice(level: int | None, auto: bool, default: int) -> int | None:
    """The asked level, or None for AUTO; exactly one of the two may be given."""
    if auto and level is not None:
        raise InvalidRequest("give either a priority or auto_priority, not both")
    if auto:
        return None
    return check_level(default if level is None else level)


def check_group_name(group: str) -> str:
    """``group`` if it is a valid node group name; InvalidRequest otherwise."""
    if not NAME_RE.match(group):
        raise InvalidRequest(f"node group {group!r} is not a valid name")
    return group


def check_task(req: TaskRequest, limits: Limits) -> CheckedTask:
    """The stored form of a submission.

    Raises:
        InvalidRequest: zero or too many nodes, an empty or too large command, a bad priority, name,
            group, watchdog, restart count or grace.
    """
    if req.num_nodes < 1 or req.num_nodes > MAX_NODES:
        raise InvalidRequest(f"num_nodes must be between 1 and {MAX_NODES}, got {req.num_nodes}")
    if not req.argv or not req.argv[0]:
        raise InvalidRequest("argv (the command) is required")
    size = sum(len(a.encode()) for a in req.argv) + sum(len(k) + len(v) for k, v in req.env.items())
    if size > limits.max_command_bytes:
        raise InvalidRequest(f"command and environment are {size} bytes; the limit is {limits.max_command_bytes}")
    if len(req.name) > MAX_NAME_CHARS:
        raise InvalidRequest(f"name: at most {MAX_NAME_CHARS} characters")
    check_seconds("watchdog_time_s", req.watchdog_time_s)
    check_seconds("suspend_grace_s", req.suspend_grace_s)
    if req.ranks_per_node > MAX_RANKS_PER_NODE:
        raise InvalidRequest(f"ranks_per_node: at most {MAX_RANKS_PER_NODE}")
    check_length("working_dir", req.working_dir, MAX_PATH_CHARS)
    check_length("image", req.image, MAX_IMAGE_CHARS)
    check_count("tags", len(req.tags), MAX_TAGS)
    if any(not k or len(k) > MAX_TAG_CHARS or len(v) > MAX_TAG_CHARS for k, v in req.tags.items()):
        raise InvalidRequest(f"tags: keys 1..{MAX_TAG_CHARS} and values up to {MAX_TAG_CHARS} characters")
    if req.max_restarts is not None and req.max_restarts > limits.max_restarts:
        raise InvalidRequest(f"max_restarts: at most {limits.max_restarts}")
    if any(not k or "=" in k for k in req.env):
        raise InvalidRequest("env names must be non-empty and contain no '='")
    if not -(2**63) <= req.whole_life_state < 2**63:
        raise InvalidRequest("whole_life_state must fit in 64 bits")
    asked = check_priority_choice(req.priority, req.auto_priority, limits.default_priority)
    group = check_group_name(req.node_group or limits.default_group)
    spec: dict[str, object] = {
        "argv": list(req.argv),
        "env": dict(req.env),
        "working_dir": req.working_dir,
        "ranks_per_node": req.ranks_per_node,
        "image": req.image,
        "tags": dict(req.tags),
    }
    return CheckedTask(
        name=req.name or req.argv[0].rsplit("/", 1)[-1],
        spec=spec,
        num_nodes=req.num_nodes,
        asked_priority=asked,
        node_group=group,
        watchdog_time_s=req.watchdog_time_s or limits.default_watchdog_time_s,
        max_restarts=limits.default_max_restarts if req.max_restarts is None else req.max_restarts,
        suspend_grace_s=req.suspend_grace_s,
        whole_life_state=req.whole_life_state,
    )


def check_quota(user_name: str, level: int, group: str, max_nodes: int) -> None:
    """A quota's fields: a valid user name, level and group, and 0..MAX_NODES nodes; InvalidRequest otherwise."""
    if not NAME_RE.match(user_name):
        raise InvalidRequest(f"user name {user_name!r} is not valid")
    check_level(level)
    check_group_name(group)
    if max_nodes < 0 or max_nodes > MAX_NODES:
        raise InvalidRequest(f"max_nodes must be between 0 and {MAX_NODES}")
