"""A service's own series: a collect function called on an interval, its samples pushed in the background."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from ff_telemetry_client.buffer import SampleBuffer
from ff_telemetry_client.pusher import PushOptions, TelemetryPusher

logger = logging.getLogger(__name__)

Collect = Callable[[SampleBuffer], Awaitable[None]]


class PeriodicReporter:
    """Calls ``collect(buffer)`` every ``interval_s`` and pushes what it added; ``run`` in a TaskGroup.

    A collect that raises is logged and tried again at the next interval: a service's work never
    depends on its telemetry.
    """

    def __init__(self, options: PushOptions, collect: Collect, interval_s: float) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, not {interval_s}")
        self.pusher = TelemetryPusher(options)
        self.buffer = self.pusher.buffer
        self._collect = collect
        self._interval_s = interval_s

    async def run(self, stop: asyncio.Event) -> None:
        """Collects and pushes until ``stop`` is set, then pushes once more (best effort) and closes the pusher."""
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.pusher.run(stop))
            while not stop.is_set():
                await self._collect_once()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self._interval_s)

    async def _collect_once(self) -> None:
        try:
            await self._collect(self.buffer)
        except Exception:
            logger.exception("collecting telemetry samples failed")


def service_reporter(
    *,
    service: str,
    node_id: int,
    hostname: str,
    mgmtd_addresses: list[str],
    token: str,
    collect: Collect,
    interval_s: float,
) -> PeriodicReporter:
    """The reporter of one service process, its samples labelled with ``service``, ``node_id`` and ``node``.

    They go to the telemetry service found through mgmtd, with the cluster token.
    """
    labels = {"service": service, "node_id": str(node_id), "node": hostname}
    options = PushOptions(token=token, mgmtd_addresses=mgmtd_addresses, common_labels=labels)
    return PeriodicReporter(options, collect, interval_s)
