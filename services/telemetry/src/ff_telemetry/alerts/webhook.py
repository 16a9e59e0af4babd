"""The webhook sink: every batch of alert changes is POSTed as JSON to each configured URL.

Retried with backoff, from a queue of its own, so a slow or dead receiver never holds up the evaluation.

Body: ``{"alerts": [{"alert_id", "rule", "kind", "severity", "state", "labels", "summary", "fired_at",
"resolved_at", "config_version"}, ...]}``. A receiver answering 2xx has it; anything else (an error status,
no answer within ``timeout_s``) is tried again up to ``max_attempts`` times. When the queue is full the
oldest batch is dropped and counted (``num_dropped``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import aiohttp

from ff_telemetry.alerts.config import Webhook
from ff_telemetry.alerts.log import AlertRecord

logger = logging.getLogger(__name__)


def _alert_json(rec: AlertRecord) -> dict[str, Any]:
    return {**asdict(rec), "labels": dict(rec.labels), "state": rec.state.value}


class WebhookSink:
    """Delivers alert changes to the webhooks from a bounded queue (see the module doc)."""

    def __init__(self, webhooks: Sequence[Webhook], *, max_queued: int = 1000, initial_backoff_s: float = 0.5) -> None:
        self.webhooks = tuple(webhooks)
        self.num_sent = 0
        self.num_failed = 0
        self.num_dropped = 0
        self._queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(max_queued)
        self._initial_backoff_s = initial_backoff_s

    def notify(self, changes: Sequence[AlertRecord]) -> None:
        """Queue one batch of changes (never blocks)."""
        if not changes or not self.webhooks:
            return
        body = {"alerts": [_alert_json(rec) for rec in changes]}
        if self._queue.full():
            self._queue.get_nowait()
            self.num_dropped += 1
        self._queue.put_nowait(body)

    async def run(self, stop: asyncio.Event) -> None:
        """Deliver queued batches to every webhook until ``stop``."""
        async with aiohttp.ClientSession() as session:
            while not stop.is_set():
                body = await _next(self._queue, stop)
                if body is None:
                    return
                await asyncio.gather(*(self._deliver(session, hook, body) for hook in self.webhooks))

    async def _deliver(self, session: aiohttp.ClientSession, hook: Webhook, body: dict[str, Any]) -> None:
        delay = self._initial_backoff_s
        for attempt in range(1, hook.max_attempts + 1):
            try:
                timeout = aiohttp.ClientTimeout(total=hook.timeout_s)
                async with session.post(hook.url, json=body, timeout=timeout) as resp:
                    if 200 <= resp.status < 300:
                        self.num_sent += 1
                        return
                    why = f"HTTP {resp.status}"
            except (aiohttp.ClientError, TimeoutError) as exc:
                why = f"{type(exc).__name__}: {exc}"
            logger.warning("alert webhook %s: attempt %d of %d failed: %s", hook.url, attempt, hook.max_attempts, why)
            if attempt < hook.max_attempts:
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)
        self.num_failed += 1


async def _next(queue: asyncio.Queue[dict[str, Any]], stop: asyncio.Event) -> dict[str, Any] | None:
    getter = asyncio.ensure_future(queue.get())
    stopper = asyncio.ensure_future(stop.wait())
    done, _ = await asyncio.wait({getter, stopper}, return_when=asyncio.FIRST_COMPLETED)
    if getter in done:
        stopper.cancel()
        return getter.result()
    getter.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await getter
    return None
