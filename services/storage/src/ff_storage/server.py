"""Wire the storage service: targets, data endpoint, routing watch and recovery loop on the service chassis.

Membership carries the target reports and applies the T/2 rule.
"""

from __future__ import annotations

import asyncio
import logging

from ff_cluster import MgmtdClient, ServiceWiring, Serving, cancel_on_stop, registry_validator, serve_service
from ff_cluster.chassis import Loop
from ff_fsprotocol.routing import RoutingView
from ff_rpc import RpcError, ServiceBinding
from ff_storage.config import StorageSettings
from ff_storage.dataserver import DataServer, TransferBoxes
from ff_storage.errors import STATUS_TABLE
from ff_storage.node import NodeConfig, StorageNode
from ff_storage.reporter import StorageReporter
from ff_storage.servicer import StorageServicer
from ff_telemetry_client import service_reporter
from fireflyer.common.v1 import common_pb2
from fireflyer.storage.v1 import storage_pb2, storage_pb2_grpc

logger = logging.getLogger(__name__)


async def _watch_routing(client: MgmtdClient, node: StorageNode, stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            async for info in client.watch_routing(node.state.view.version if node.state.view else 0):
                node.state.on_routing(RoutingView(info))
                if stop.is_set():
                    return
        except RpcError as err:
            logger.warning("routing watch failed: %s", err)
            await asyncio.sleep(0.2)


async def main(settings: StorageSettings, stop: asyncio.Event | None = None) -> None:
    """Open the targets and serve the storage service until ``stop`` is set (or a signal)."""
    stop = stop or asyncio.Event()
    token = settings.resolved_cluster_token()
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    boxes = TransferBoxes(ttl_s=settings.transfer_ttl_s, max_owner_bytes=settings.max_inbox_bytes)
    node = StorageNode(
        NodeConfig(
            node_id=settings.node_id,
            disks=settings.disk_list(),
            targets_file=settings.state_dir / "targets.json",
            cluster_token=token,
            max_io_bytes=settings.max_io_bytes,
            max_batch_bytes=settings.max_batch_bytes,
            forward_timeout_s=settings.forward_timeout_s,
            data_wait_s=settings.data_wait_s,
            fsync=settings.fsync,
            update_ids=settings.update_ids,
            update_id_ttl_s=settings.update_id_ttl_s,
            max_update_ids_per_chunk=settings.max_update_ids_per_chunk,
            max_batch_ios=settings.max_batch_ios,
            max_read_batch_bytes=settings.max_read_batch_bytes,
            max_inline_read_bytes=settings.max_inline_read_bytes,
        ),
        boxes,
    )
    await asyncio.to_thread(node.state.open_targets)
    node.reader.bind_loop()
    mgmtd = MgmtdClient(settings.mgmtd_address_list(), token=token, timeout_s=3.0)
    validator = registry_validator(mgmtd, settings.token_cache_ttl_s)
    servicer = StorageServicer(node)
    data = DataServer(boxes, token, validator, read=servicer.read_on_data_path, calls=servicer.data_path_calls())
    await data.start(settings.data_listen_address)
    data_address = f"{settings.data_listen_address.rsplit(':', 1)[0]}:{data.port}"

    def loops_after_registration(serving: Serving) -> list[Loop]:
        node.state.node_id = serving.node_id
        loops = [
            cancel_on_stop(_watch_routing(mgmtd, node, serving.stop), serving.stop),
            node.recovery.sync_loop(serving.stop, settings.sync_scan_interval_s),
        ]
        if settings.telemetry_interval_s > 0:
            loops.append(
                service_reporter(
                    service="storage",
                    node_id=serving.node_id,
                    hostname=serving.hostname,
                    mgmtd_addresses=settings.mgmtd_address_list(),
                    token=token,
                    collect=StorageReporter(node).collect,
                    interval_s=settings.telemetry_interval_s,
                ).run(serving.stop)
            )
        return loops

    wiring = ServiceWiring(
        node_type=common_pb2.NODE_TYPE_STORAGE,
        status_table=STATUS_TABLE,
        token_validator=validator,
        bindings=[
            ServiceBinding(
                storage_pb2.DESCRIPTOR.services_by_name["StorageService"].full_name,
                storage_pb2_grpc.add_StorageServiceServicer_to_server,
                servicer,
            )
        ],
        mgmtd_addresses=settings.mgmtd_address_list(),
        endpoints={"data": data_address},
        tags={"disks": str(len(settings.disk_list()))},
        on_lease_lost=node.state.lease_lost,
        on_lease_regained=node.state.lease_regained,
        target_reports=node.state.target_reports,
        loops_after_registration=loops_after_registration,
        ready_info=lambda serving: {"data": data_address},
    )
    try:
        await serve_service(settings, wiring, stop)
    finally:
        await data.stop()
        await node.state.finish_updates()
        await mgmtd.close()
        await node.close_channels()
        node.close()
    logger.info("storage stopped")
