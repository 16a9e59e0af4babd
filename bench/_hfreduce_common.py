"""What the hfreduce benchmarks share: a rank's GroupConfig on a loopback layout, and free ports."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ff_config.ports import pick_free_ports
from ff_testing import free_port

if TYPE_CHECKING:
    from hfreduce import GroupConfig

__all__ = ["free_port", "free_ports", "loopback_config"]


def free_ports(count: int) -> tuple[int, ...]:
    """``count`` distinct ports free a moment ago, below the ephemeral range (see ``ff_testing.free_port``)."""
    return tuple(pick_free_ports(count))


def loopback_config(node: int, local: int, nodes: int, num_local: int, port: int, **options: Any) -> GroupConfig:
    """The GroupConfig of local rank ``local`` on node ``node`` of a ``nodes`` x ``num_local`` layout whose
    nodes all live on this machine (master on 127.0.0.1:``port``); ``options`` set the other fields."""
    from hfreduce import GroupConfig  # in the rank processes only

    return GroupConfig(
        master_addr="127.0.0.1",
        master_port=port,
        node_rank=node,
        num_nodes=nodes,
        local_rank=local,
        local_world_size=num_local,
        **options,
    )
