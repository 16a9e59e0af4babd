"""What ``up`` and ``down`` do about ``--hosts``: the hosts' network, made before the services start, removed after.

Choose or reuse the hosts' network, place the plan's instances on it, make the namespaces and links before the services
start, and remove them after ``down``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TextIO

from ff_appliance import hosts
from ff_appliance.hosts import HostsError, LinkShape, NetworkPlan
from ff_appliance.state import ClusterPlan, StateDir, load_plan, place_on_hosts, save_plan

LinkShapes = Sequence[tuple[str | None, LinkShape | None]]
HostZones = Sequence[tuple[str, str]]


def choose_network(
    state: StateDir, num_hosts: int | None, shapes: LinkShapes, zones: HostZones = ()
) -> NetworkPlan | None:
    """The network this ``up`` runs the cluster on, checked before anything is written or started.

    The plan's, a new one for ``--hosts N`` on a new cluster, or None (everything on loopback).

    Raises:
        HostsError: ``--hosts`` differs from the plan's, is given for a cluster that runs on loopback, or
            ``--link-shape`` or ``--host-zone`` without hosts; not root; a named host is not in the network.
    """
    existing = load_plan(state)
    has_hosts = num_hosts is not None or (existing is not None and existing.network is not None)
    if (shapes or zones) and not has_hosts:  # (said before the checks of root and tools: the request is wrong)
        raise HostsError("--link-shape and --host-zone are about the hosts of --hosts: this cluster has none")
    if shapes:
        hosts.check_can_make()
        hosts.check_shapes(shape for _, shape in shapes)
    if existing is not None and existing.network is not None:
        have = len(existing.network.hosts)
        if num_hosts is not None and num_hosts != have:
            raise HostsError(
                f"this cluster runs on {have} hosts (chosen at its first up); --hosts {num_hosts} "
                "cannot change that (start a new state folder for another layout)"
            )
        hosts.check_can_make()
        return hosts.with_zones(hosts.with_shapes(existing.network, shapes), zones)
    if num_hosts is None:
        return None
    if existing is not None:
        raise HostsError(
            f"this cluster runs on this machine's loopback (chosen at its first up): --hosts is for a "
            f"new cluster (start a new state folder, not {state.root})"
        )
    hosts.check_can_make()
    return hosts.with_zones(hosts.with_shapes(hosts.new_network(num_hosts, hosts.taken_networks()), shapes), zones)


def apply_network(state: StateDir, plan: ClusterPlan, network: NetworkPlan, out: TextIO) -> ClusterPlan:
    """Place ``plan`` on ``network`` (saved when that changed it) and make the network's missing parts.

    Raises:
        HostsError: an ``ip`` or ``tc`` command failed.
    """
    placed = place_on_hosts(plan, network)
    if placed != plan:
        save_plan(state, placed)
    for line in hosts.ensure_network(network):
        print(f"hosts: made {line}", file=out)
    shaped = [f"{h.name} {h.shape.describe()}" for h in network.hosts if h.shape is not None]
    zoned = [f"{h.name} in zone {h.zone}" for h in network.hosts if h.zone]
    print(
        f"hosts: {len(network.hosts)} on {network.subnet}.0/24 (bridge {network.bridge}, "
        f"{network.bridge_address}){'; shaped: ' + ', '.join(shaped) if shaped else ''}"
        f"{'; ' + ', '.join(zoned) if zoned else ''}",
        file=out,
    )
    return placed


def remove_network(plan: ClusterPlan, out: TextIO) -> None:
    """After ``down`` stopped every instance: remove the namespaces and links of the plan's network."""
    if plan.network is None:
        return
    if os.geteuid() != 0:
        print(f"hosts: not root, the namespaces and links {plan.network.prefix}-* stay", file=out)
        return
    removed = hosts.remove_network(plan.network.prefix)
    print(f"hosts: removed {len(removed)} namespaces and bridges ({plan.network.prefix}-*)", file=out)
