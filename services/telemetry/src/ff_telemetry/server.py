"""Wire the collector: store, HTTP server, scraper, alerts and downsampling job on the service chassis."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

from ff_cluster import MgmtdClient, ServiceWiring, Serving, registry_validator, serve_service
from ff_cluster.chassis import Loop
from ff_rpc import ServiceBinding
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
    """Open the store (migrating it) and serve gRPC, HTTP, scraping, retention and alerts until ``stop``."""
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
    list_alerts = alerts.list_alerts if alerts else None
    web = WebServer(store, cluster_token, validator, settings.exposition_max_age_s)
    reader = dashboard.ClusterReader(mgmtd_addresses)
    dashboard.install(web.app, store, web.authenticate, reader, list_alerts)

    def loops(serving: Serving) -> list[Loop]:
        started = [run_retention(store, settings.downsample_interval_s, serving.stop)]
        if alerts is not None:
            started.append(alerts.run(serving.stop))
        if settings.scrape_interval_s > 0:
            scraper = Scraper(store, mgmtd, settings.scrape_interval_s, settings.scrape_timeout_s)
            started.append(scraper.run(serving.stop))
        return started

    try:
        await web.start(settings.http_address)
        http = f"{settings.http_address.rsplit(':', 1)[0]}:{web.port}"
        wiring = ServiceWiring(
            node_type=common_pb2.NODE_TYPE_TELEMETRY,
            bindings=[
                ServiceBinding(
                    telemetry_pb2.DESCRIPTOR.services_by_name["TelemetryService"].full_name,
                    telemetry_pb2_grpc.add_TelemetryServiceServicer_to_server,
                    TelemetryServicer(store, list_alerts),
                )
            ],
            status_table=STATUS_TABLE,
            token_validator=validator,
            max_request_bytes=MAX_REQUEST_BYTES,
            mgmtd_addresses=mgmtd_addresses,
            endpoints={"http": http},
            loops=loops,
            ready_info=lambda serving: {"http": http},
        )
        await serve_service(settings, wiring, stop)
    finally:
        await web.stop()
        await reader.close()
        await mgmtd.close()
        await asyncio.to_thread(store.close)
        await asyncio.to_thread(sql.dispose)
    logger.info("telemetry stopped")
