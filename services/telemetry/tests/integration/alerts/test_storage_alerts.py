"""Storage faults on real processes (mgmtd and 2 storage services, chains of 2; telemetry in this process):
a storage service SIGKILLed raises node-lost and target-not-serving, both resolve once it is back and its
targets serve again; every change reaches the webhook, which refuses the first delivery (so it is retried).
The storage services' own series (per-target space and bytes) reach telemetry: storage-near-full fires at a
threshold every disk is over."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from ff_testing import free_port
from ff_testing.cluster import CLUSTER_TOKEN, StorageCluster, start_cluster, tail_logs
from ff_testing.telemetry import TelemetryClient
from ff_testing.telemetry import start_in_process as start_telemetry
from ff_testing.waiting import eventually
from fireflyer.telemetry.v1 import telemetry_pb2 as pb

RULES = """
version = 1
interval_s = 0.3
[[rules]]
name = "storage-lost"
kind = "node_lost"
node_types = ["storage"]
[[rules]]
name = "target-not-serving"
kind = "target_not_serving"
for_s = 0.5
[[rules]]
name = "storage-near-full"
kind = "storage_near_full"
threshold = 0.000001
[[webhooks]]
url = "http://127.0.0.1:{port}/hook"
timeout_s = 2.0
"""


class Hook:
    """A webhook receiver that answers 500 to the first POST and 200 after."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.num_posts = 0

    async def handle(self, request: web.Request) -> web.Response:
        self.num_posts += 1
        if self.num_posts == 1:
            return web.Response(status=500)
        self.bodies.append(await request.json())
        return web.Response(status=200)

    def changes(self, rule: str) -> list[tuple[str, str]]:
        return [
            (a["state"], a["labels"].get("node_id", "")) for b in self.bodies for a in b["alerts"] if a["rule"] == rule
        ]


@pytest.fixture
async def hook() -> AsyncIterator[tuple[Hook, int]]:
    receiver, port = Hook(), free_port()
    app = web.Application()
    app.router.add_post("/hook", receiver.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield receiver, port
    finally:
        await runner.cleanup()


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[StorageCluster]:
    c = await start_cluster(
        tmp_path, num_nodes=2, targets_per_disk=1, replication=2, fsync=False, extra={"telemetry-interval-s": "0.3"}
    )
    try:
        yield c
    finally:
        c.stop()


async def alerts(client: TelemetryClient, rule: str) -> list[pb.Alert]:
    return list((await client.call(client.stub.ListAlerts, pb.ListAlertsRequest(rule=rule))).alerts)


async def test_a_storage_service_killed_and_back(
    cluster: StorageCluster, hook: tuple[Hook, int], tmp_path: Path
) -> None:
    receiver, port = hook
    (tmp_path / "rules.toml").write_text(RULES.format(port=port))
    telemetry = await start_telemetry(
        tmp_path,
        f"sqlite:///{tmp_path / 'telemetry.db'}",
        cluster.mgmtd_address,
        CLUSTER_TOKEN,
        alerts=True,
        alerts_config=tmp_path / "rules.toml",
        scrape_interval_s=0,
    )
    client = TelemetryClient(telemetry.address, CLUSTER_TOKEN)
    victim = cluster.nodes[1]
    victim_targets = {str(t.target_id) for c in (await cluster.routing()).chains for t in c.targets if t.node_id == 102}
    try:

        async def all_near_full() -> bool:
            return {a.labels["target_id"] for a in await alerts(client, "storage-near-full")} >= victim_targets

        await eventually(all_near_full, timeout_s=30, what="storage-near-full from the storage services' series")
        assert await alerts(client, "storage-lost") == []
        victim.kill()

        async def lost() -> bool:
            fired = {a.labels.get("target_id") for a in await alerts(client, "target-not-serving") if not a.resolved_at}
            return bool(await alerts(client, "storage-lost")) and fired >= victim_targets

        await eventually(lost, timeout_s=30, what="storage-lost and target-not-serving")
        (node_alert,) = await alerts(client, "storage-lost")
        assert dict(node_alert.labels) == {"node_id": "102", "node_type": "storage", "node": node_alert.labels["node"]}
        victim.start()
        await victim.ready()

        async def resolved() -> bool:
            found = [*await alerts(client, "storage-lost"), *await alerts(client, "target-not-serving")]
            return all(a.resolved_at for a in found)

        await eventually(resolved, timeout_s=60, what="the alerts resolved once the node serves again")

        async def delivered() -> bool:
            return receiver.changes("storage-lost") == [("firing", "102"), ("resolved", "102")]

        await eventually(delivered, timeout_s=20, what="both changes at the webhook")
        assert receiver.num_posts >= 2  # the first was refused and retried
    except BaseException:
        print(tail_logs(cluster.folder))
        raise
    finally:
        await client.close()
        await telemetry.shutdown()
