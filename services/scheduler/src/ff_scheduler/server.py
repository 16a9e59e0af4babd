"""Wire the scheduler together: store, driver, gRPC server, mgmtd membership, graceful stop."""

from __future__ import annotations

import asyncio
import logging
import socket
from pathlib import Path

from ff_cluster import MembershipOptions, MgmtdClient, NodeMembership, registry_validator
from ff_rpc import RpcServer, ServerOptions, ServiceBinding, install_stop_signals, write_ready_file
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
    server = RpcServer(
        ServerOptions(
            listen_address=settings.listen_address,
            metrics_address=settings.metrics_address or None,
            cluster_token=cluster_token,
            token_validator=registry_validator(mgmtd, settings.token_cache_ttl_s),
            status_table=STATUS_TABLE,
            grace_s=settings.grace_s,
            max_request_bytes=validation.MAX_REQUEST_BYTES,
        ),
        [
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
    )
    await server.start()
    address = settings.advertise_address or server.address
    instance_id = settings.instance_id or address
    try:
        membership = NodeMembership(
            MembershipOptions(
                mgmtd_addresses=mgmtd_addresses,
                cluster_token=cluster_token,
                node_id=settings.node_id,
                node_type=common_pb2.NODE_TYPE_SCHEDULER,
                hostname=socket.gethostname(),
                endpoints={
                    "grpc": address,
                    **({"metrics": f"127.0.0.1:{server.metrics_port}"} if server.metrics_port else {}),
                },
                tags={"instance_id": instance_id},
            )
        )
        if settings.ready_file is not None:
            write_ready_file(
                settings.ready_file, grpc=address, metrics_port=server.metrics_port, instance_id=instance_id
            )
        install_stop_signals(stop)
        async with asyncio.TaskGroup() as tg:
            tg.create_task(scheduler.run(stop))
            tg.create_task(membership.run(stop))
            if settings.telemetry_interval_s > 0:
                await _until_registered(membership, stop)
                tg.create_task(service_reporter(
                    service="scheduler", node_id=membership.node_id, hostname=socket.gethostname(),
                    mgmtd_addresses=mgmtd_addresses, token=cluster_token,
                    collect=SchedulerReporter(scheduler).collect, interval_s=settings.telemetry_interval_s,
                ).run(stop))  # fmt: skip
    finally:
        await server.stop()
        await store.drain(timeout_s=10.0)
        await agents.close()
        if checkpoints is not None:
            await checkpoints.close()
        await mgmtd.close()
        await asyncio.to_thread(store.dispose)
    logger.info("scheduler stopped")


async def _until_registered(membership: NodeMembership, stop: asyncio.Event) -> None:
    waiter = asyncio.ensure_future(membership.registered.wait())
    stopper = asyncio.ensure_future(stop.wait())
    await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()
    stopper.cancel()
