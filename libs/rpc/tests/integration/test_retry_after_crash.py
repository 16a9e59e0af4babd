"""A non-idempotent call whose server ran it and died before answering is not sent again (real processes, gRPC).

gRPC answers UNAVAILABLE both for a call no server got (no connection) and for one whose connection was lost after
the server ran it; only the first may go to another instance. A reviewer saw the second retried: a Create applied
twice on two meta instances.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from ff_rpc import RetryPolicy, RpcError
from ff_rpc.retry import retry_call
from ff_testing import free_port

# A server whose one method records that it ran, then dies before answering (as a meta instance killed mid-call).
SERVER = """
import asyncio, os, sys, grpc
async def handler(request, context):
    with open(sys.argv[2], "a") as f:
        f.write("ran\\n")
    os._exit(1)
async def main():
    server = grpc.aio.server()
    methods = {"Create": grpc.unary_unary_rpc_method_handler(handler)}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.S", methods),))
    server.add_insecure_port("127.0.0.1:" + sys.argv[1])
    await server.start()
    print("up", flush=True)
    await server.wait_for_termination()
asyncio.run(main())
"""


class Instances:
    """The router: after a failed attempt, the next instance."""

    def __init__(self, addresses: list[str]) -> None:
        self.addresses, self.current = addresses, 0

    async def follow(self, err: RpcError) -> bool:
        self.current += 1
        return True


async def _create(instances: Instances) -> None:
    address = instances.addresses[instances.current % len(instances.addresses)]
    async with grpc.aio.insecure_channel(address) as channel:
        try:
            await channel.unary_unary("/t.S/Create")(b"", timeout=10)
        except grpc.aio.AioRpcError as err:
            raise RpcError.from_grpc(err) from None


def _start_servers(log: Path, ports: list[int]) -> list[subprocess.Popen[bytes]]:
    procs = [subprocess.Popen([sys.executable, "-c", SERVER, str(p), str(log)], stdout=subprocess.PIPE) for p in ports]
    for proc in procs:
        assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
    return procs


async def test_a_call_its_server_ran_before_dying_is_not_sent_to_the_next_instance(tmp_path: Path) -> None:
    log = tmp_path / "ran"
    log.touch()
    ports = [free_port(), free_port()]
    procs = await asyncio.to_thread(_start_servers, log, ports)
    instances = Instances([f"127.0.0.1:{p}" for p in ports])
    policy = RetryPolicy(max_attempts=2, initial_backoff_s=0.01, max_backoff_s=0.01)

    async def create() -> None:
        await retry_call(
            lambda: _create(instances), policy=policy, idempotent=False, router=instances, unavailable_did_not_run=True
        )

    try:
        with pytest.raises(RpcError) as err:
            await create()
        assert err.value.code is grpc.StatusCode.UNAVAILABLE, err.value
        assert log.read_text().count("ran") == 1  # ran once, on the first instance; not sent to the second
        # A call no server got (every instance gone): sent to the next one, then given up; nothing ran.
        for proc in procs:
            proc.kill()
            await asyncio.to_thread(proc.wait)
        with pytest.raises(RpcError) as refused:
            await create()
        assert "failed to connect" in refused.value.details and log.read_text().count("ran") == 1
    finally:
        for proc in procs:
            proc.kill()
            await asyncio.to_thread(proc.wait)
            if proc.stdout is not None:
                proc.stdout.close()
