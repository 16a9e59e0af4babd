"""Wire the meta service: store (migrations), mgmtd client, operators and servicer on the service chassis."""

from __future__ import annotations

import asyncio
import logging

from ff_cluster import MgmtdClient, ServiceWiring, Serving, registry_validator, serve_service
from ff_cluster.chassis import Loop
from ff_fsprotocol.meta_once import ONCE_TAG, ONCE_TAG_VALUE
from ff_meta.config import MetaSettings
from ff_meta.errors import STATUS_TABLE
from ff_meta.ops import MetaOps, MetaOptions
from ff_meta.reporter import MetaReporter
from ff_meta.servicer import MetaServicer
from ff_meta.store.metastore import MIGRATIONS, MetaStore
from ff_rpc import ServiceBinding
from ff_telemetry_client import service_reporter
from fireflyer.common.v1 import common_pb2
from fireflyer.meta.v1 import meta_pb2, meta_pb2_grpc

logger = logging.getLogger(__name__)

__all__ = ["MIGRATIONS", "main"]


def options_of(settings: MetaSettings, cluster_token: str) -> MetaOptions:
    """The operators' options from the settings."""
    return MetaOptions(
        cluster_token=cluster_token,
        default_chain_table_id=settings.default_chain_table_id,
        default_chunk_size=settings.default_chunk_size,
        default_stripe_size=settings.default_stripe_size,
        lease_s=settings.session_lease_s,
        capability_ttl_s=settings.capability_ttl_s,
        writable_capability_ttl_s=settings.writable_capability_ttl_s,
        trash_retention_s=settings.trash_retention_s,
        capacity_bytes=settings.capacity_bytes,
        background_interval_s=settings.background_interval_s,
    )


async def main(settings: MetaSettings, stop: asyncio.Event | None = None) -> None:
    """Serve meta until ``stop`` is set (or SIGTERM)."""
    stop = stop or asyncio.Event()
    token = settings.resolved_cluster_token()
    url = settings.database_url.get_secret_value()
    store = await asyncio.to_thread(MetaStore.open, url, synchronous=settings.sqlite_synchronous)
    mgmtd = MgmtdClient(settings.mgmtd_address_list(), token=token, timeout_s=5.0)
    ops = MetaOps.build(store, mgmtd, options_of(settings, token))
    try:
        await serve_service(settings, _wiring(settings, ops, mgmtd, token), stop)
    finally:
        await ops.close()
        await store.close()
        await mgmtd.close()
        await asyncio.to_thread(store.dispose)
    logger.info("meta stopped")


def _wiring(settings: MetaSettings, ops: MetaOps, mgmtd: MgmtdClient, token: str) -> ServiceWiring:
    def reporter(serving: Serving) -> list[Loop]:
        if settings.telemetry_interval_s <= 0:
            return []
        return [
            service_reporter(
                service="meta",
                node_id=serving.node_id,
                hostname=serving.hostname,
                mgmtd_addresses=settings.mgmtd_address_list(),
                token=token,
                collect=MetaReporter(serving.server.metrics).collect,
                interval_s=settings.telemetry_interval_s,
            ).run(serving.stop)
        ]

    return ServiceWiring(
        node_type=common_pb2.NODE_TYPE_META,
        status_table=STATUS_TABLE,
        token_validator=registry_validator(mgmtd, settings.token_cache_ttl_s),
        bindings=[
            ServiceBinding(
                meta_pb2.DESCRIPTOR.services_by_name["MetaService"].full_name,
                meta_pb2_grpc.add_MetaServiceServicer_to_server,
                MetaServicer(ops),
            )
        ],
        mgmtd_addresses=settings.mgmtd_address_list(),
        fast=True,  # metadata calls are small: gRPC's own cost would be most of each (ff_rpc.fastpath)
        tags={ONCE_TAG: ONCE_TAG_VALUE},  # clients retry ONCE_METHODS only at instances that say so
        loops=lambda serving: [ops.background.run(serving.stop)],
        loops_after_registration=reporter,
    )
