"""Wire the meta service: store (migrations), mgmtd client, gRPC server, membership, background work."""

from __future__ import annotations

import asyncio
import logging
import socket
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, event

from ff_cluster import MembershipOptions, MgmtdClient, NodeMembership, registry_validator
from ff_meta.app import MetaApp, MetaOptions
from ff_meta.config import MetaSettings
from ff_meta.errors import STATUS_TABLE
from ff_meta.reporter import MetaReporter
from ff_meta.servicer import MetaServicer
from ff_meta.store.schema import VERSION_TABLE
from ff_rpc import RpcServer, ServerOptions, ServiceBinding, install_stop_signals, write_ready_file
from ff_store import open_store
from ff_telemetry_client import service_reporter
from fireflyer.common.v1 import common_pb2
from fireflyer.meta.v1 import meta_pb2, meta_pb2_grpc

logger = logging.getLogger(__name__)

MIGRATIONS = Path(__file__).parent / "store" / "migrations"


def tune_sqlite(engine: Engine, synchronous: str) -> None:
    """Meta's SQLite durability setting, on every pooled connection (no-op on PostgreSQL)."""
    if engine.dialect.name != "sqlite":
        return

    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.execute(f"PRAGMA synchronous = {synchronous}")

    event.listen(engine, "connect", on_connect)
    engine.dispose()


def options_of(settings: MetaSettings, cluster_token: str) -> MetaOptions:
    return MetaOptions(
        cluster_token=cluster_token, default_chain_table_id=settings.default_chain_table_id,
        default_chunk_size=settings.default_chunk_size, default_stripe_size=settings.default_stripe_size,
        lease_s=settings.session_lease_s, capability_ttl_s=settings.capability_ttl_s,
        trash_retention_s=settings.trash_retention_s, capacity_bytes=settings.capacity_bytes,
        background_interval_s=settings.background_interval_s, sqlite_synchronous=settings.sqlite_synchronous,
    )  # fmt: skip


async def main(settings: MetaSettings, stop: asyncio.Event | None = None) -> None:
    stop = stop or asyncio.Event()
    token = settings.resolved_cluster_token()
    store = await asyncio.to_thread(open_store, settings.database_url, MIGRATIONS, VERSION_TABLE)
    tune_sqlite(store.engine, settings.sqlite_synchronous)
    mgmtd = MgmtdClient(settings.mgmtd_list(), token=token, timeout_s=5.0)
    app = MetaApp(store, mgmtd, options_of(settings, token))
    server = RpcServer(
        ServerOptions(listen_address=settings.listen_address, metrics_address=settings.metrics_address or None,
                      cluster_token=token, token_validator=registry_validator(mgmtd, settings.token_cache_ttl_s),
                      status_table=STATUS_TABLE, grace_s=settings.grace_s),
        [ServiceBinding(meta_pb2.DESCRIPTOR.services_by_name["MetaService"].full_name,
                        meta_pb2_grpc.add_MetaServiceServicer_to_server, MetaServicer(app))],
    )  # fmt: skip
    await server.start()
    membership = NodeMembership(MembershipOptions(
        mgmtd_addresses=settings.mgmtd_list(), cluster_token=token, node_id=settings.node_id,
        node_type=common_pb2.NODE_TYPE_META, hostname=socket.gethostname(),
        endpoints={"grpc": server.address,
                   **({"metrics": f"127.0.0.1:{server.metrics_port}"} if server.metrics_port else {})},
        tags={"instance_id": settings.instance_id or server.address},
    ))  # fmt: skip
    try:
        install_stop_signals(stop)
        async with asyncio.TaskGroup() as tg:
            tg.create_task(membership.run(stop))
            tg.create_task(app.background(stop))
            await membership.registered.wait()
            if settings.telemetry_interval_s > 0:
                tg.create_task(service_reporter(
                    service="meta", node_id=membership.node_id, hostname=socket.gethostname(),
                    mgmtd_addresses=settings.mgmtd_list(), token=token,
                    collect=MetaReporter(server.metrics).collect, interval_s=settings.telemetry_interval_s,
                ).run(stop))  # fmt: skip
            if settings.ready_file is not None:
                write_ready_file(settings.ready_file, grpc=server.address, metrics_port=server.metrics_port,
                                 node_id=membership.node_id)  # fmt: skip
            await stop.wait()
    finally:
        await server.stop()
        await app.close()
        await mgmtd.close()
        await asyncio.to_thread(store.dispose)
    logger.info("meta stopped")
