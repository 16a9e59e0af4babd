"""The service chassis against a real mgmtd: the ready file is written only once the node is registered, the
hooks run in order, and a stop before registration ends the service without a ready file."""

from __future__ import annotations

import asyncio
from pathlib import Path

from ff_cluster import ServiceWiring, Serving, serve_service
from ff_cluster.chassis import Loop
from ff_config import MgmtdClientSettings
from ff_config.ports import free_port
from ff_rpc import StatusTable
from ff_testing.mgmtd import CLUSTER_TOKEN, start_in_process
from ff_testing.process import wait_ready
from fireflyer.common.v1 import common_pb2
from fireflyer.mgmtd.v1 import mgmtd_pb2


class _Recorder:
    """A service with no RPCs of its own that notes what the chassis asks of it, in order."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.node_id_after_registration = -1
        self.loop_started = asyncio.Event()

    def wiring(self, mgmtd_addresses: list[str]) -> ServiceWiring:
        return ServiceWiring(
            node_type=common_pb2.NODE_TYPE_META,
            bindings=[],
            status_table=StatusTable(),
            token_validator=None,
            mgmtd_addresses=mgmtd_addresses,
            endpoints={"data": "127.0.0.1:1"},
            tags={"role": "probe"},
            on_bound=self._on_bound,
            loops=self._loops,
            loops_after_registration=self._after_registration,
            ready_info=lambda serving: {"extra": "yes"},
            on_stop=self._on_stop,
        )

    async def _on_bound(self, address: str) -> None:
        self.events.append("bound")

    def _loops(self, serving: Serving) -> list[Loop]:
        return [self._loop("loop", serving.stop)]

    def _after_registration(self, serving: Serving) -> list[Loop]:
        self.node_id_after_registration = serving.node_id
        return [self._loop("registered loop", serving.stop)]

    async def _loop(self, name: str, stop: asyncio.Event) -> None:
        self.events.append(f"{name} started")
        self.loop_started.set()
        await stop.wait()
        self.events.append(f"{name} ended")

    async def _on_stop(self, serving: Serving) -> None:
        self.events.append("on_stop, server stopping" if serving.server.stopping.is_set() else "on_stop, serving")


def _settings(tmp_path: Path, mgmtd_addresses: str, metrics_address: str = "") -> MgmtdClientSettings:
    return MgmtdClientSettings.model_validate(
        {
            "cluster_token": CLUSTER_TOKEN,
            "mgmtd_addresses": mgmtd_addresses,
            "metrics_address": metrics_address,
            "ready_file": tmp_path / "probe.ready.json",
            "instance_id": "probe-1",
            "grace_s": 0.5,
        }
    )


async def test_ready_file_is_written_once_registered(tmp_path: Path) -> None:
    mgmtd = await start_in_process(tmp_path, f"sqlite:///{tmp_path / 'mgmtd.db'}")
    client = mgmtd.client()
    try:
        # /metrics on another loopback address than gRPC: the registered endpoint must name its own host.
        settings, probe, stop = _settings(tmp_path, mgmtd.address, "127.0.0.2:0"), _Recorder(), asyncio.Event()
        task = asyncio.create_task(serve_service(settings, probe.wiring([mgmtd.address]), stop))
        ready = await wait_ready(tmp_path / "probe.ready.json", timeout_s=20)
        # Read at once: the node must already be in mgmtd's registry.
        info = (await client.mgmtd.get_routing_info(mgmtd_pb2.GetRoutingInfoRequest())).routing_info
        node = next(n for n in info.nodes if n.tags.get("instance_id") == "probe-1")
        assert ready["node_id"] == node.node_id == probe.node_id_after_registration > 0
        assert (ready["instance_id"], ready["extra"]) == ("probe-1", "yes")
        assert node.status == mgmtd_pb2.NODE_STATUS_ALIVE and node.tags["role"] == "probe"
        assert {e.name: e.address for e in node.endpoints} == {
            "grpc": ready["grpc"],
            "data": "127.0.0.1:1",
            "metrics": f"127.0.0.2:{ready['metrics_port']}",
        }
        stop.set()
        await asyncio.wait_for(task, 15)
        assert probe.events[:3] == ["bound", "loop started", "registered loop started"]
        # The loops end as stop is set, on_stop runs meanwhile, before the server stops.
        assert sorted(probe.events[3:]) == ["loop ended", "on_stop, serving", "registered loop ended"]
    finally:
        await client.close()
        await mgmtd.shutdown()


async def test_stop_before_registration_ends_without_a_ready_file(tmp_path: Path) -> None:
    settings, probe, stop = _settings(tmp_path, f"127.0.0.1:{free_port()}"), _Recorder(), asyncio.Event()
    task = asyncio.create_task(serve_service(settings, probe.wiring(settings.mgmtd_address_list()), stop))
    await asyncio.wait_for(probe.loop_started.wait(), 15)
    stop.set()
    await asyncio.wait_for(task, 15)
    assert probe.events[:2] == ["bound", "loop started"]
    assert sorted(probe.events[2:]) == ["loop ended", "on_stop, serving"]
    assert probe.node_id_after_registration == -1
    assert not settings.ready_file or not settings.ready_file.exists()
