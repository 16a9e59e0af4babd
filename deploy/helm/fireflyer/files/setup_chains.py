"""The chart's setup Job: once every storage pod has registered with mgmtd, make chain table 1 over them if the
cluster has no chains yet (what ``fireflyer up`` does after bringing a cluster up); nothing when it has some.

Reads FF_SETUP_* from the Job's environment: MGMTD_ADDRESSES, CLUSTER_TOKEN_FILE, STORAGE_NODES (how many must
be alive), TARGETS_PER_DISK, REPLICATION, TIMEOUT_S. Exit 0 when the cluster has chains, 1 on a timeout.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

from ff_cluster import MgmtdClient
from ff_rpc import RpcError
from fireflyer.common.v1 import common_pb2
from fireflyer.mgmtd.v1 import mgmtd_pb2
from hf3fs.admin import setup_chain_table

POLL_S = 2.0


async def alive_storage(mgmtd: MgmtdClient) -> tuple[int, int]:
    """(alive storage nodes, chains) in mgmtd's routing info."""
    info = (await mgmtd.mgmtd.get_routing_info(mgmtd_pb2.GetRoutingInfoRequest())).routing_info
    alive = sum(
        1 for n in info.nodes if n.node_type == common_pb2.NODE_TYPE_STORAGE and n.status == mgmtd_pb2.NODE_STATUS_ALIVE
    )
    return alive, len(info.chains)


async def main() -> int:
    env = os.environ
    addresses = [a for a in env["FF_SETUP_MGMTD_ADDRESSES"].split(",") if a]
    token = (await asyncio.to_thread(Path(env["FF_SETUP_CLUSTER_TOKEN_FILE"]).read_text)).strip()
    wanted = int(env["FF_SETUP_STORAGE_NODES"])
    deadline = time.monotonic() + float(env["FF_SETUP_TIMEOUT_S"])
    mgmtd = MgmtdClient(addresses, token=token)
    try:
        while True:
            try:
                alive, chains = await alive_storage(mgmtd)
            except (RpcError, TimeoutError, OSError) as err:  # mgmtd not up yet: wait for it as for storage
                print(f"setup: mgmtd not answering yet: {err}", flush=True)
                alive, chains = -1, 0
            if chains:
                print(f"setup: the cluster has {chains} chains; nothing to do", flush=True)
                return 0
            if alive >= wanted:
                break
            if time.monotonic() > deadline:
                print(f"setup: {max(alive, 0)} of {wanted} storage nodes alive at the deadline", file=sys.stderr)
                return 1
            await asyncio.sleep(POLL_S)
        made = await setup_chain_table(
            mgmtd,
            token,
            targets_per_disk=int(env["FF_SETUP_TARGETS_PER_DISK"]),
            replication=int(env["FF_SETUP_REPLICATION"]),
        )
        count = len(made.chains) if made is not None else 0
        print(f"setup: made chain table 1 with {count} chains over {alive} storage nodes", flush=True)
        return 0
    finally:
        await mgmtd.close()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
