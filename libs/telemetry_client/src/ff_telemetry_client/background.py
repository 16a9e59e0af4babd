"""A TelemetryPusher on its own thread and event loop, for synchronous code (a training loop)."""

from __future__ import annotations

import asyncio
import logging
import threading

from ff_telemetry_client.buffer import SampleBuffer
from ff_telemetry_client.pusher import PushOptions, TelemetryPusher

logger = logging.getLogger(__name__)


class BackgroundPusher:
    """A daemon thread that pushes ``buffer`` every ``flush_interval_s``; ``close`` pushes the rest and stops it.

    ``close`` waits at most ``timeout_s``. The thread is a daemon so that it never keeps a finished training
    process alive.
    """

    def __init__(self, options: PushOptions, buffer: SampleBuffer | None = None) -> None:
        self.options = options
        self.buffer = buffer if buffer is not None else SampleBuffer()
        self.pusher: TelemetryPusher | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name="ff-telemetry-push", daemon=True)

    def start(self) -> BackgroundPusher:
        """Starts the thread and returns once its pusher exists (``self.pusher``); returns ``self``, to chain."""
        self._thread.start()
        self._ready.wait()
        return self

    def close(self, timeout_s: float = 5.0) -> None:
        """Push what is buffered (best effort, at most ``timeout_s``) and stop the thread."""
        loop, stop = self._loop, self._stop
        if loop is None or stop is None or not self._thread.is_alive():
            return
        loop.call_soon_threadsafe(stop.set)
        self._thread.join(timeout_s)

    def _main(self) -> None:
        try:
            asyncio.run(self._run())
        except Exception:
            logger.exception("the telemetry push thread stopped")
        finally:
            self._ready.set()

    async def _run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self.pusher = TelemetryPusher(self.options, self.buffer)
        self._ready.set()
        await self.pusher.run(self._stop)
