"""On PostgreSQL no meta request holds the event loop (issue 17): reads used to run ``Store.run`` inline in
the async handlers, so one read waiting for the database froze every other call. Here a table lock held by
the test makes a Stat wait in the database; meanwhile the same meta process still answers its health check
at once, and the Stat completes when the lock goes."""

from __future__ import annotations

import asyncio
import threading
import time

import grpc
import sqlalchemy as sa
from grpc_health.v1 import health_pb2, health_pb2_grpc

import hf3fs
from ff_meta.store.schema import counters
from ff_testing.cluster import CLUSTER_TOKEN
from ff_testing.meta import meta_process
from ff_testing.waiting import wait_until

from .conftest import MetaCluster


async def _health(address: str, timeout_s: float) -> tuple[grpc.StatusCode, float]:
    start = time.monotonic()
    async with grpc.aio.insecure_channel(address) as channel:
        try:
            await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout_s)
            code = grpc.StatusCode.OK
        except grpc.aio.AioRpcError as err:
            code = err.code()
    return code, time.monotonic() - start


def _waiting_for_a_lock(engine: sa.Engine) -> bool:
    """Whether a session waits for a lock on meta_inodes (the one the test holds)."""
    query = "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = 'meta_inodes'::regclass"
    with engine.connect() as conn:
        return int(conn.execute(sa.text(query)).scalar_one()) > 0


def test_a_read_waiting_for_postgres_does_not_hold_the_event_loop(cluster: MetaCluster, postgres_url: str) -> None:
    meta = meta_process(cluster.storage.folder, "pgloop", mgmtd_address=cluster.mgmtd, cluster_token=CLUSTER_TOKEN,
                        database_url=postgres_url, background_interval_s=0.3)  # fmt: skip
    engine = sa.create_engine(postgres_url.replace("postgresql://", "postgresql+psycopg://", 1))
    meta.start()
    try:
        asyncio.run(meta.ready())
        with engine.begin() as conn:  # ids of its own (it shares the storage cluster; no data is written here)
            conn.execute(sa.update(counters).where(counters.c.name == "next_inode_id").values(value=1 << 41))
        with hf3fs.connect(cluster.mgmtd, cluster.tokens["alice"], meta_addresses=[meta.address]) as fs:
            fs.makedirs("/loop/a")
            assert asyncio.run(_health(meta.address, 2.0))[0] is grpc.StatusCode.OK
            answers: list[object] = []
            with engine.connect() as locker:
                locker.execute(sa.text("LOCK TABLE meta_inodes IN ACCESS EXCLUSIVE MODE"))
                reader = threading.Thread(target=lambda: answers.append(fs.stat("/loop/a").inode_id))
                reader.start()
                wait_until(lambda: _waiting_for_a_lock(engine), timeout_s=30, what="meta's Stat waiting for the lock")
                assert not answers, "the Stat should be waiting for the lock"
                code, took = asyncio.run(_health(meta.address, 3.0))
                locker.rollback()
            reader.join(timeout=30)
            assert code is grpc.StatusCode.OK and took < 2.0, (code, took)
            assert answers == [fs.stat("/loop/a").inode_id]
    finally:
        engine.dispose()
        meta.stop()
