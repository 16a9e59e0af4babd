"""Wire the collector together: store, gRPC server, HTTP server, scraper, downsampling job, mgmtd membership."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from pathlib import Path

from ff_cluster import MembershipOptions, MgmtdClient, NodeMembership, registry_validator
from ff_rpc import RpcServer, ServerOptions, ServiceBinding, install_stop_signals, write_ready_file
from ff_store import open_store
from ff_telemetry import dashboard
from ff_telemetry.alerts.config import DEFAULT_CONFIG
from ff_telemetry.alerts.service import AlertService
from ff_telemetry.config import TelemetrySettings
from ff_telemetry.core.validation import MAX_REQUEST_BYTES
from ff_telemetry.errors import STATUS_TABLE
from ff_telemetry.scrape import Scraper
from ff_telemetry.servicer import TelemetryServicer
from ff_telemetry.store.api import TelemetryStore
from ff_telemetry.store.schema import VERSION_TABLE
from ff_telemetry.store.sqlite import set_synchronous
from ff_telemetry.web import WebServer
from fireflyer.common.v1 import common_pb2
from fireflyer.telemetry.v1 import telemetry_pb2, telemetry_pb2_grpc

logger = logging.getLogger(__name__)

MIGRATIONS = Path(__file__).parent / "store" / "migrations"


async def run_retention(store: TelemetryStore, interval_s: float, stop: asyncio.Event) -> None:
    """The downsampling and retention job, every ``interval_s`` until ``stop``."""
    while not stop.is_set():
        try:
            report = await store.arun_retention()
            if report.num_minute_buckets or report.num_raw_deleted:
                logger.info("downsampled", extra={"report": report.__dict__})
        except Exception:
            logger.warning("downsampling failed", exc_info=True)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval_s)


async def main(settings: TelemetrySettings, stop: asyncio.Event | None = None) -> None:
    stop = stop or asyncio.Event()
    cluster_token = settings.resolved_cluster_token()
    sql = await asyncio.to_thread(open_store, settings.resolved_database_url(), MIGRATIONS, VERSION_TABLE)
    set_synchronous(sql.engine, settings.sqlite_synchronous)
    store = TelemetryStore(
        sql, limits=settings.limits(), retention=settings.retention(), raw_query_span_s=settings.raw_query_span_s
    )
    mgmtd_addresses = settings.mgmtd_address_list()
    mgmtd = MgmtdClient(mgmtd_addresses, token=cluster_token, timeout_s=5.0)
    validator = registry_validator(mgmtd, settings.token_cache_ttl_s)
    alerts = (
        AlertService.create(store, mgmtd, cluster_token, settings.state_dir, settings.alerts_config or DEFAULT_CONFIG)
        if settings.alerts
        else None
    )
    server = RpcServer(
        ServerOptions(
            listen_address=settings.listen_address,
            metrics_address=settings.metrics_address or None,
            cluster_token=cluster_token,
            token_validator=validator,
            status_table=STATUS_TABLE,
            grace_s=settings.grace_s,
            max_request_bytes=MAX_REQUEST_BYTES,
        ),
        [
            ServiceBinding(
                telemetry_pb2.DESCRIPTOR.services_by_name["TelemetryService"].full_name,
                telemetry_pb2_grpc.add_TelemetryServiceServicer_to_server,
                TelemetryServicer(store, alerts.list_alerts if alerts else None),
            )
        ],
    )
    web = WebServer(store, cluster_token, validator, settings.exposition_max_age_s)
    reader = dashboard.ClusterReader(mgmtd_addresses)
    dashboard.install(web.app, store, web.authenticate, reader, alerts.list_alerts if alerts else None)
    await server.start()
    try:
        await web.start(settings.http_address)
        address = settings.advertise_address or server.address
        http = f"{settings.http_address.rsplit(':', 1)[0]}:{web.port}"
        instance_id = settings.instance_id or address
        membership = NodeMembership(
            MembershipOptions(
                mgmtd_addresses=mgmtd_addresses,
                cluster_token=cluster_token,
                node_id=settings.node_id,
                node_type=common_pb2.NODE_TYPE_TELEMETRY,
                hostname=socket.gethostname(),
                endpoints={
                    "grpc": address,
                    "http": http,
                    **({"metrics": f"127.0.0.1:{server.metrics_port}"} if server.metrics_port else {}),
                },
                tags={"instance_id": instance_id},
            )
        )
        if settings.ready_file is not None:
            write_ready_file(
                settings.ready_file, grpc=address, http=http, metrics_port=server.metrics_port,
                instance_id=instance_id,
            )  # fmt: skip
        install_stop_signals(stop)
        async with asyncio.TaskGroup() as tg:
            tg.create_task(membership.run(stop))
            tg.create_task(run_retention(store, settings.downsample_interval_s, stop))
            if alerts is not None:
                tg.create_task(alerts.run(stop))
            if settings.scrape_interval_s > 0:
                scraper = Scraper(store, mgmtd, settings.scrape_interval_s, settings.scrape_timeout_s)
                tg.create_task(scraper.run(stop))
    finally:
        await server.stop()
        await web.stop()
        await reader.close()
        await mgmtd.close()
        await asyncio.to_thread(sql.dispose)
    logger.info("telemetry stopped")
