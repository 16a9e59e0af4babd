"""The appliance's storage step: chains of 3 replicas over the storage services, then every target serving.

After a restart, targets go through recovery first.
"""

from __future__ import annotations

import asyncio
import time

from ff_cluster import MgmtdClient
from fireflyer.mgmtd.v1 import mgmtd_pb2
from hf3fs.admin import setup_chain_table

REPLICATION = 3
TARGETS_PER_DISK = 2
SERVING_TIMEOUT_S = 60.0
POLL_S = 0.2
# Serving must hold this long with no routing change: right after a restart mgmtd still shows the
# states of before, until the storage services' first heartbeats (targets offline, to recover) arrive.
STABLE_S = 2.5


async def ensure_chains(mgmtd: MgmtdClient, cluster_token: str) -> str:
    """Create targets, chains and chain table 1 on a new cluster; then wait for every target to serve."""
    created = await setup_chain_table(mgmtd, cluster_token, targets_per_disk=TARGETS_PER_DISK, replication=REPLICATION)
    info = await _wait_all_serving(mgmtd, SERVING_TIMEOUT_S)
    num_targets = sum(len(c.targets) for c in info.chains)
    verb = "created" if created is not None else "found"
    return f"{verb} {len(info.chains)} chains of {REPLICATION} ({num_targets} targets), all serving"


async def _wait_all_serving(mgmtd: MgmtdClient, timeout_s: float) -> mgmtd_pb2.RoutingInfo:
    deadline = time.monotonic() + timeout_s
    stable_since, stable_version = 0.0, -1
    while True:
        resp = await mgmtd.mgmtd.get_routing_info(mgmtd_pb2.GetRoutingInfoRequest())
        info: mgmtd_pb2.RoutingInfo = resp.routing_info
        waiting = [
            f"{t.target_id}:{mgmtd_pb2.PublicTargetState.Name(t.public_state).removeprefix('PUBLIC_TARGET_STATE_')}"
            for c in info.chains
            for t in c.targets
            if t.public_state != mgmtd_pb2.PUBLIC_TARGET_STATE_SERVING
        ]
        now = time.monotonic()
        if not info.chains or waiting:
            stable_version = -1
        elif info.version != stable_version:
            stable_since, stable_version = now, info.version
        elif now - stable_since >= STABLE_S:
            return info
        if time.monotonic() > deadline:
            raise TimeoutError(f"storage targets not serving after {timeout_s:.0f}s: {', '.join(waiting)}")
        await asyncio.sleep(POLL_S)
