"""Scraping: every interval, the /metrics endpoint of each alive service, stored as the cluster's series.

The services are those mgmtd knows alive, at the `metrics` endpoint every service registers; what they expose
is parsed and stored as the cluster's own series.

A target's series get `job` (its node type: mgmtd, meta, storage, ...), `instance` (the scraped
address) and `node_id`; a scraped label of one of those names is kept as `exported_<name>`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from ff_cluster import MgmtdClient
from ff_telemetry.core.errors import TelemetryError
from ff_telemetry.core.model import MetricMeta, MetricType
from ff_telemetry.core.validation import PushBatch, RawSample
from ff_telemetry.store.api import TelemetryStore
from fireflyer.common.v1 import common_pb2
from fireflyer.mgmtd.v1 import mgmtd_pb2

logger = logging.getLogger(__name__)

TARGET_LABELS = ("job", "instance", "node_id")
_TYPES = {
    "counter": MetricType.COUNTER,
    "gauge": MetricType.GAUGE,
    "histogram": MetricType.HISTOGRAM,
    "summary": MetricType.SUMMARY,
}


@dataclass(frozen=True)
class Target:
    """One service to scrape: its job (node type), node and metrics address."""

    job: str
    node_id: int
    address: str

    @property
    def url(self) -> str:
        """The target's /metrics URL."""
        return f"http://{self.address}/metrics"


def targets(routing: mgmtd_pb2.RoutingInfo) -> list[Target]:
    """Alive nodes with a `metrics` endpoint."""
    found = []
    for node in routing.nodes:
        if node.status != mgmtd_pb2.NODE_STATUS_ALIVE:
            continue
        job = common_pb2.NodeType.Name(node.node_type).removeprefix("NODE_TYPE_").lower()
        for ep in node.endpoints:
            if ep.name == "metrics" and ep.address:
                found.append(Target(job, node.node_id, ep.address))
    return found


def parse(text: str, target: Target, now: float) -> tuple[list[RawSample], tuple[MetricMeta, ...]]:
    """Samples and metadata of a Prometheus text exposition (``_created`` series left out)."""
    samples, metadata = [], {}
    for family in text_string_to_metric_families(text):
        mtype = _TYPES.get(family.type, MetricType.GAUGE)
        for s in family.samples:
            if s.name.endswith("_created"):
                continue
            name = s.name if mtype in (MetricType.COUNTER, MetricType.GAUGE) else family.name
            metadata[name] = MetricMeta(name, mtype, family.documentation, family.unit)
            labels = {(f"exported_{k}" if k in TARGET_LABELS else k): v for k, v in s.labels.items()}
            labels.update(job=target.job, instance=target.address, node_id=str(target.node_id))
            samples.append(RawSample(s.name, labels, float(s.value), float(s.timestamp or now)))
    return samples, tuple(metadata.values())


class Scraper:
    """Scrapes every target mgmtd lists each ``interval_s`` and stores the samples (see the module doc)."""

    def __init__(self, store: TelemetryStore, mgmtd: MgmtdClient, interval_s: float, timeout_s: float) -> None:
        self._store = store
        self._mgmtd = mgmtd
        self._interval_s = interval_s
        self._timeout_s = timeout_s
        self.num_scrapes = 0

    async def run(self, stop: asyncio.Event) -> None:
        """Scrape every ``interval_s`` until ``stop``; a failed round is logged and the next one runs."""
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self._timeout_s)) as http:
            while not stop.is_set():
                try:
                    await self.scrape_all(http)
                except Exception:
                    logger.warning("scrape round failed", exc_info=True)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self._interval_s)

    async def scrape_all(self, http: aiohttp.ClientSession) -> int:
        """One round over every target; the number of samples stored."""
        resp = await self._mgmtd.mgmtd.get_routing_info(mgmtd_pb2.GetRoutingInfoRequest())
        found = targets(resp.routing_info)
        stored = await asyncio.gather(*(self._scrape(http, t) for t in found))
        self.num_scrapes += 1
        return sum(stored)

    async def _scrape(self, http: aiohttp.ClientSession, target: Target) -> int:
        try:
            async with http.get(target.url) as response:
                response.raise_for_status()
                text = await response.text()
            raw, metadata = parse(text, target, time.time())
            samples = self._store.checker.build(raw, {}, owner=None, now=self._store.clock())
            return (await self._store.apush(PushBatch(samples, metadata))).num_stored
        except (aiohttp.ClientError, TimeoutError, ValueError, TelemetryError) as exc:
            logger.warning("scraping %s (%s) failed: %s", target.url, target.job, exc)
            return 0
