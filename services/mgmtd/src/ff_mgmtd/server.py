"""Wire mgmtd: store, app and servicers on the service chassis (which registers mgmtd with itself)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from ff_cluster import ServiceWiring, serve_service
from ff_mgmtd.app import Mgmtd, Timing
from ff_mgmtd.bootstrap import import_admin_token
from ff_mgmtd.config import MgmtdSettings
from ff_mgmtd.core import validation
from ff_mgmtd.errors import STATUS_TABLE
from ff_mgmtd.servicer import IdentityServicer, LocalTokenChecker, MgmtdServicer
from ff_mgmtd.store.schema import VERSION_TABLE
from ff_rpc import CachingTokenValidator, ServiceBinding
from ff_store import Store, open_store
from fireflyer.common.v1 import common_pb2
from fireflyer.mgmtd.v1 import mgmtd_pb2, mgmtd_pb2_grpc

logger = logging.getLogger(__name__)

MIGRATIONS = Path(__file__).parent / "store" / "migrations"


async def main(settings: MgmtdSettings, stop: asyncio.Event | None = None) -> None:
    """Open the database (migrating it), import the bootstrap admin token, serve mgmtd until ``stop`` (or a signal).

    Raises:
        BootstrapAdminError: ``bootstrap_admin_token_file`` cannot be used (before anything is served).
    """
    stop = stop or asyncio.Event()
    store = await asyncio.to_thread(open_store, settings.resolved_database_url(), MIGRATIONS, VERSION_TABLE)
    try:
        if settings.bootstrap_admin_token_file is not None:
            await import_admin_token(store, settings.bootstrap_admin_token_file, settings.bootstrap_admin_user)
        await serve_service(settings, _wiring(settings, store, stop), stop)
    finally:
        await asyncio.to_thread(store.dispose)
    logger.info("mgmtd stopped")


def _wiring(settings: MgmtdSettings, store: Store, stop: asyncio.Event) -> ServiceWiring:
    timing = Timing(
        lease_duration_s=settings.lease_duration_s,
        heartbeat_interval_s=settings.heartbeat_interval_s,
        election_lease_s=settings.election_lease_s,
        chain_scan_interval_s=settings.chain_scan_interval_s,
    )
    # The server must be bound before the instance knows the address it campaigns with (on_bound).
    mgmtd = Mgmtd(store, timing, instance_id="", address="")
    # mgmtd's own cache is short and dropped on every revoke or disable (see IdentityServicer).
    local_ttl_s = min(settings.token_cache_ttl_s, 1.0)
    validator = CachingTokenValidator(LocalTokenChecker(mgmtd, local_ttl_s), ttl_s=local_ttl_s)
    services = mgmtd_pb2.DESCRIPTOR.services_by_name

    async def on_bound(address: str) -> None:
        mgmtd.address = address
        mgmtd.instance_id = settings.instance_id or address
        await mgmtd.start()

    return ServiceWiring(
        node_type=common_pb2.NODE_TYPE_MGMTD,
        status_table=STATUS_TABLE,
        token_validator=validator,
        max_request_bytes=validation.MAX_REQUEST_BYTES,
        bindings=[
            ServiceBinding(
                services["MgmtdService"].full_name,
                mgmtd_pb2_grpc.add_MgmtdServiceServicer_to_server,
                MgmtdServicer(mgmtd, stop),
            ),
            ServiceBinding(
                services["IdentityService"].full_name,
                mgmtd_pb2_grpc.add_IdentityServiceServicer_to_server,
                IdentityServicer(mgmtd, settings.token_cache_ttl_s, validator),
            ),
        ],
        mgmtd_addresses=None,  # it registers with itself
        on_bound=on_bound,
        loops=lambda serving: [mgmtd.run(serving.stop)],
        ready_info=lambda serving: {"cluster_id": mgmtd.cluster_id},
    )
