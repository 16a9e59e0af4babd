"""Wire mgmtd together: store, app, gRPC server, self-registration, background loops, graceful stop."""

from __future__ import annotations

import asyncio
import logging
import socket
from pathlib import Path

from ff_cluster import MembershipOptions, NodeMembership
from ff_mgmtd.app import Mgmtd, Timing
from ff_mgmtd.config import MgmtdSettings
from ff_mgmtd.core import validation
from ff_mgmtd.errors import STATUS_TABLE
from ff_mgmtd.servicer import IdentityServicer, LocalTokenChecker, MgmtdServicer
from ff_mgmtd.store.schema import VERSION_TABLE
from ff_rpc import CachingTokenValidator, RpcServer, ServerOptions, ServiceBinding, install_stop_signals
from ff_rpc.server import write_ready_file
from ff_store import open_store
from fireflyer.common.v1 import common_pb2
from fireflyer.mgmtd.v1 import mgmtd_pb2, mgmtd_pb2_grpc

logger = logging.getLogger(__name__)

MIGRATIONS = Path(__file__).parent / "store" / "migrations"


async def main(settings: MgmtdSettings, stop: asyncio.Event | None = None) -> None:
    stop = stop or asyncio.Event()
    cluster_token = settings.resolved_cluster_token()
    store = await asyncio.to_thread(open_store, settings.resolved_database_url(), MIGRATIONS, VERSION_TABLE)
    timing = Timing(
        lease_duration_s=settings.lease_duration_s, heartbeat_interval_s=settings.heartbeat_interval_s,
        election_lease_s=settings.election_lease_s, chain_scan_interval_s=settings.chain_scan_interval_s,
    )  # fmt: skip
    services = mgmtd_pb2.DESCRIPTOR.services_by_name
    # The server must be bound before the instance knows the address it campaigns with.
    mgmtd = Mgmtd(store, timing, instance_id="", address="")
    # mgmtd's own cache is short and dropped on every revoke or disable (see IdentityServicer).
    local_ttl_s = min(settings.token_cache_ttl_s, 1.0)
    validator = CachingTokenValidator(LocalTokenChecker(mgmtd, local_ttl_s), ttl_s=local_ttl_s)
    server = RpcServer(
        ServerOptions(
            listen_address=settings.listen_address, metrics_address=settings.metrics_address or None,
            cluster_token=cluster_token, token_validator=validator, status_table=STATUS_TABLE,
            grace_s=settings.grace_s, max_request_bytes=validation.MAX_REQUEST_BYTES,
        ),
        [
            ServiceBinding(services["MgmtdService"].full_name, mgmtd_pb2_grpc.add_MgmtdServiceServicer_to_server,
                           MgmtdServicer(mgmtd, stop)),
            ServiceBinding(services["IdentityService"].full_name, mgmtd_pb2_grpc.add_IdentityServiceServicer_to_server,
                           IdentityServicer(mgmtd, settings.token_cache_ttl_s, validator)),
        ],
    )  # fmt: skip
    await server.start()
    mgmtd.address = settings.advertise_address or server.address
    mgmtd.instance_id = settings.instance_id or mgmtd.address
    try:
        await mgmtd.start()
        membership = NodeMembership(
            MembershipOptions(
                mgmtd_addresses=[mgmtd.address], cluster_token=cluster_token, node_id=settings.node_id,
                node_type=common_pb2.NODE_TYPE_MGMTD, hostname=socket.gethostname(),
                endpoints={"grpc": mgmtd.address, **({"metrics": f"127.0.0.1:{server.metrics_port}"}
                                                    if server.metrics_port else {})},
                tags={"instance_id": mgmtd.instance_id},
            )
        )  # fmt: skip
        if settings.ready_file is not None:
            write_ready_file(
                settings.ready_file, grpc=mgmtd.address, metrics_port=server.metrics_port,
                instance_id=mgmtd.instance_id, cluster_id=mgmtd.cluster_id,
            )  # fmt: skip
        install_stop_signals(stop)
        async with asyncio.TaskGroup() as tg:
            tg.create_task(mgmtd.run(stop))
            tg.create_task(membership.run(stop))
    finally:
        await server.stop()
        await asyncio.to_thread(store.dispose)
    logger.info("mgmtd stopped")
