"""Wire the scheduler: store, driver, agent pool and servicers on the service chassis."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from ff_cluster import MgmtdClient, ServiceWiring, Serving, registry_validator, serve_service
from ff_cluster.chassis import Loop
from ff_rpc import ServiceBinding
from ff_scheduler.agents import AgentPool
from ff_scheduler.app import DriverOptions, Scheduler
from ff_scheduler.checkpoints import ManifestCheck
from ff_scheduler.config import SchedulerSettings
from ff_scheduler.core import validation
from ff_scheduler.errors import STATUS_TABLE
from ff_scheduler.reporter import SchedulerReporter
from ff_scheduler.servicer import SchedulerAgentServicer, SchedulerServicer
from ff_scheduler.store.schema import VERSION_TABLE
from ff_scheduler.txn import Transactions
from ff_store import open_store
from ff_telemetry_client import service_reporter
from fireflyer.common.v1 import common_pb2
from fireflyer.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc

logger = logging.getLogger(__name__)

MIGRATIONS = Path(__file__).parent / "store" / "migrations"


async def main(settings: SchedulerSettings, stop: asyncio.Event | None = None) -> None:
    """Open the database (migrating it) and serve the scheduler until ``stop`` is set (or a signal)."""
    stop = stop or asyncio.Event()
    cluster_token = settings.resolved_cluster_token()
    store = Transactions(
        await asyncio.to_thread(open_store, settings.resolved_database_url(), MIGRATIONS, VERSION_TABLE)
    )
    mgmtd_addresses = settings.mgmtd_address_list()
    mgmtd = MgmtdClient(mgmtd_addresses, token=cluster_token, timeout_s=5.0)
    agents = AgentPool(cluster_token, settings.agent_call_timeout_s)
    options = DriverOptions(
        tick_interval_s=settings.tick_interval_s,
        master_port=settings.master_port,
        order_resend_interval_s=settings.order_resend_interval_s,
        term_grace_s=settings.term_grace_s,
    )
    scheduler = Scheduler(store, settings.scheduling_policy(), settings.lifecycle_policy(), options, agents, mgmtd)
    checkpoints = ManifestCheck(mgmtd, cluster_token) if settings.check_checkpoints else None
    services = scheduler_pb2.DESCRIPTOR.services_by_name
    report_interval_s = max(1.0, settings.tick_interval_s * 5)

    def reporter(serving: Serving) -> list[Loop]:
        if settings.telemetry_interval_s <= 0:
            return []
        return [
            service_reporter(
                service="scheduler",
                node_id=serving.node_id,
                hostname=serving.hostname,
                mgmtd_addresses=mgmtd_addresses,
                token=cluster_token,
                collect=SchedulerReporter(scheduler).collect,
                interval_s=settings.telemetry_interval_s,
            ).run(serving.stop)
        ]

    wiring = ServiceWiring(
        node_type=common_pb2.NODE_TYPE_SCHEDULER,
        bindings=[
            ServiceBinding(
                services["SchedulerService"].full_name,
                scheduler_pb2_grpc.add_SchedulerServiceServicer_to_server,
                SchedulerServicer(scheduler, settings.limits()),
            ),
            ServiceBinding(
                services["SchedulerAgentService"].full_name,
                scheduler_pb2_grpc.add_SchedulerAgentServiceServicer_to_server,
                SchedulerAgentServicer(scheduler, settings.default_group, report_interval_s, checkpoints),
            ),
        ],
        status_table=STATUS_TABLE,
        token_validator=registry_validator(mgmtd, settings.token_cache_ttl_s),
        max_request_bytes=validation.MAX_REQUEST_BYTES,
        mgmtd_addresses=mgmtd_addresses,
        loops=lambda serving: [scheduler.run(serving.stop)],
        loops_after_registration=reporter,
    )
    try:
        await serve_service(settings, wiring, stop)
    finally:
        await store.drain(timeout_s=10.0)
        await agents.close()
        if checkpoints is not None:
            await checkpoints.close()
        await mgmtd.close()
        await asyncio.to_thread(store.dispose)
    logger.info("scheduler stopped")
