"""gRPC health checks (grpc.health.v1), the same probe ``grpc_health_probe`` makes."""

from __future__ import annotations

import asyncio
import enum
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

PROBE_INTERVAL_S = 0.1


class Health(enum.StrEnum):
    """A probe's answer; UNREACHABLE: the check failed (nothing listens there, or no answer within the timeout)."""

    SERVING = "SERVING"
    NOT_SERVING = "NOT_SERVING"
    UNREACHABLE = "unreachable"


async def check_health(address: str, *, service: str = "", timeout_s: float = 1.0) -> Health:
    """Ask ``address`` for the health of ``service`` ("" is the whole server)."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            response = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
        except grpc.aio.AioRpcError as err:
            if err.code() is grpc.StatusCode.NOT_FOUND:
                return Health.NOT_SERVING
            return Health.UNREACHABLE
    return Health.SERVING if response.status == health_pb2.HealthCheckResponse.SERVING else Health.NOT_SERVING


async def wait_serving(address: str, deadline: float) -> Health:
    """Probe until SERVING or the (monotonic) deadline; the last answer."""
    while True:
        health = await check_health(address)
        if health is Health.SERVING or time.monotonic() >= deadline:
            return health
        await asyncio.sleep(PROBE_INTERVAL_S)
