"""A service serving in the test's own event loop, as an asyncio task: its ``main(settings, stop)`` run for real.

For tests that reach into the service's process (monkeypatching a store function, counting calls); the others
start the service as a process (``process.service_process``), as the appliance does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ff_rpc import RpcClient, open_channel
from ff_testing.process import wait_ready

READY_TIMEOUT_S = 20.0
S = TypeVar("S")


@dataclass
class InProcessService:
    """A service serving in this event loop (``start_in_process``); ``shutdown`` stops it.

    ``info`` is its ready file's content (``grpc``, and what else the service writes there).
    """

    info: dict[str, Any]
    stop: asyncio.Event
    task: asyncio.Task[None]

    @property
    def address(self) -> str:
        """The gRPC address the service serves on."""
        return str(self.info["grpc"])

    async def shutdown(self, timeout_s: float = 30.0) -> None:
        """Stop the service and wait up to ``timeout_s`` for its ``main`` to return."""
        self.stop.set()
        await asyncio.wait_for(self.task, timeout=timeout_s)


async def start_in_process(
    main: Callable[[S, asyncio.Event], Coroutine[Any, Any, None]],
    settings: S,
    ready_file: Path,
    timeout_s: float = READY_TIMEOUT_S,
) -> InProcessService:
    """Run ``main(settings, stop)`` as a task of this event loop; return once it wrote ``ready_file``.

    A stale ready file is removed first. On failure (the service stopped, or no ready file within ``timeout_s``)
    the service is stopped and the error raised.
    """
    await asyncio.to_thread(ready_file.unlink, missing_ok=True)
    stop = asyncio.Event()
    task = asyncio.create_task(main(settings, stop))
    try:
        info = await wait_ready(ready_file, timeout_s=timeout_s)
    except Exception:
        stop.set()
        await task
        raise
    return InProcessService(info, stop, task)


class ServiceClient:
    """A channel to one service and calls on it with one token; subclasses add the service's stubs."""

    def __init__(self, address: str, token: str, timeout_s: float = 10.0) -> None:
        self.channel = open_channel(address)
        self.rpc = RpcClient(token=token, timeout_s=timeout_s)

    async def call(self, method: Any, request: Any) -> Any:
        """Call ``method`` (a method of one of the client's stubs) with the client's token; RpcError on failure."""
        return await self.rpc.unary(method, request)

    async def close(self) -> None:
        """Close the channel."""
        await self.channel.close()
