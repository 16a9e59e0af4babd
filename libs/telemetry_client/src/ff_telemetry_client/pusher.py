"""The sender: batches from a SampleBuffer to the telemetry service, found through mgmtd.

A batch goes as a packed push (TelemetryService.PushPacked: series ids, values and times as packed
arrays, which the collector stores without looking at each sample): the series are registered once
(RegisterSeries) and their ids kept per collector; after a collector restart (FAILED_PRECONDITION) or a
series it no longer knows (NOT_FOUND) they are registered again and the batch sent once more. A collector
without PushPacked (UNIMPLEMENTED) gets PushSamples instead.

It never raises to its caller and never blocks the code that adds samples: a push that fails puts its
batch back (the buffer's bound drops the oldest); a batch the service refuses as malformed is dropped and
counted. The count of dropped samples is pushed as the counter ``ff_telemetry_client_dropped_samples``
with the next batch that goes through.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import grpc

from ff_cluster import MgmtdClient
from ff_rpc import RetryPolicy, RpcClient, RpcError
from ff_rpc.client import ClientPool
from ff_telemetry_client.buffer import Kind, Point, SampleBuffer
from fireflyer.common.v1 import common_pb2
from fireflyer.telemetry.v1 import telemetry_pb2
from fireflyer.telemetry.v1.telemetry_client import TelemetryServiceClient

logger = logging.getLogger(__name__)

DROPPED_METRIC = "ff_telemetry_client_dropped_samples"
FINAL_FLUSH_S = 2.0
MAX_RETRY_S = 10.0
_KINDS = {Kind.GAUGE: telemetry_pb2.METRIC_TYPE_GAUGE, Kind.COUNTER: telemetry_pb2.METRIC_TYPE_COUNTER}
_ONE_RETRY = RetryPolicy(max_attempts=2)
# Refusals that sending the same batch again cannot fix.
_REFUSED = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.PERMISSION_DENIED,
    }
)
# The collector does not know the ids (restarted, or the series expired): register again.
_REGISTER_AGAIN = frozenset(
    {
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.PERMISSION_DENIED,
    }
)
SeriesKey = tuple[str, tuple[tuple[str, str], ...]]


@dataclass
class _Registry:
    """The series ids one collector gave, and which instance of it (its registry epoch)."""

    epoch: int = 0
    ids: dict[SeriesKey, int] = field(default_factory=dict)


def _packed(typecode: str, items: Sequence[float] | Sequence[int]) -> bytes:
    packed = array(typecode, items)
    if sys.byteorder == "big":
        packed.byteswap()  # the wire is little-endian
    return packed.tobytes()


@dataclass(frozen=True, kw_only=True)
class PushOptions:
    """Where to push and how.

    Attributes:
        token: the caller's token (a rank's run token, a service's cluster token).
        mgmtd_addresses: where to find the telemetry service (the first alive one in the routing info).
        address: the telemetry service's gRPC address; empty: found through mgmtd.
        common_labels: added to every sample (a sample's own label of the same name wins at the service).
    """

    token: str | Callable[[], str]
    mgmtd_addresses: Sequence[str] = ()
    address: str = ""
    common_labels: Mapping[str, str] = field(default_factory=dict)
    batch_size: int = 500
    flush_interval_s: float = 1.0
    timeout_s: float = 5.0
    # After a failed push or no telemetry found, wait this long before trying again.
    retry_interval_s: float = 2.0

    def __post_init__(self) -> None:
        if not self.address and not self.mgmtd_addresses:
            raise ValueError("a telemetry address or mgmtd addresses are needed")
        if self.batch_size < 1 or self.flush_interval_s <= 0:
            raise ValueError("batch_size must be at least 1 and flush_interval_s positive")


class TelemetryPusher:
    """Sends what a SampleBuffer holds every ``flush_interval_s``; ``run`` in the owner's TaskGroup."""

    def __init__(self, options: PushOptions, buffer: SampleBuffer | None = None) -> None:
        self.options = options
        self.buffer = buffer if buffer is not None else SampleBuffer()
        self.num_pushed = 0
        self._address = options.address
        mgmtd = list(options.mgmtd_addresses)
        self._mgmtd = (
            MgmtdClient(mgmtd, token=options.token, timeout_s=options.timeout_s, retry=_ONE_RETRY) if mgmtd else None
        )
        self._rpc = RpcClient(token=options.token, timeout_s=options.timeout_s, retry=RetryPolicy(max_attempts=2))
        self._collectors = ClientPool(TelemetryServiceClient, self._rpc)
        self._described: set[str] = set()
        self._dropped_reported = 0
        self._registries: dict[str, _Registry] = {}
        self._packed_push = True  # False once a collector answered UNIMPLEMENTED: PushSamples instead

    async def run(self, stop: asyncio.Event) -> None:
        """Push until ``stop`` is set, then once more (best effort) and close."""
        try:
            failures = 0
            while not stop.is_set():
                failures = 0 if await self.flush() else failures + 1
                # No telemetry (or down): try again later and later, up to MAX_RETRY_S.
                retry = min(self.options.retry_interval_s * 2 ** min(failures - 1, 10), MAX_RETRY_S)
                wait = self.options.flush_interval_s if not failures else retry
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), wait)
            with contextlib.suppress(TimeoutError):  # the owner is stopping: a last push, briefly
                await asyncio.wait_for(self.flush(), FINAL_FLUSH_S)
        finally:
            await self.close()

    async def flush(self) -> bool:
        """Push everything buffered now, a batch at a time; False when a push could not be made."""
        while True:
            batch = self.buffer.take(self.options.batch_size)
            dropped = self.buffer.dropped
            if not batch and dropped == self._dropped_reported:
                return True
            if not await self._push(batch, dropped):
                self.buffer.put_back(batch)
                return False
            if len(batch) < self.options.batch_size:
                return True

    async def close(self) -> None:
        """Closes the channels to telemetry and mgmtd: ``run`` does on its way out; a caller of ``flush`` alone must."""
        await self._collectors.close()
        if self._mgmtd is not None:
            await self._mgmtd.close()

    async def _push(self, batch: list[Point], dropped: int) -> bool:
        address = await self._find()
        if not address:
            return False
        try:
            if self._packed_push:
                await self._push_packed(address, batch, dropped)
            else:
                request = self._request(batch, dropped)
                await self._collectors.get(address).push_samples(request)
                self._described.update(m.name for m in request.metadata)
        except RpcError as err:
            if err.code is grpc.StatusCode.UNIMPLEMENTED and self._packed_push:
                logger.info("telemetry at %s has no packed push: using PushSamples", address)
                self._packed_push = False
                return await self._push(batch, dropped)
            if err.code in _REFUSED:
                logger.warning("telemetry refused %d samples: %s: %s", len(batch), err.code.name, err.details)
                self.buffer.drop(len(batch))
                return True
            logger.debug("pushing samples to %s failed: %s", address, err)
            if not self.options.address:
                self._address = ""  # find it again: it may have moved
            return False
        self.num_pushed += len(batch)
        self._dropped_reported = dropped
        return True

    async def _push_packed(self, address: str, batch: list[Point], dropped: int) -> None:
        """Register the batch's unknown series and push it packed; once more after NOT_FOUND/FAILED_PRECONDITION.

        Those say the collector restarted or forgot the series. Raises RpcError.
        """
        points = batch
        if dropped:
            points = [*batch, Point(DROPPED_METRIC, float(dropped), time.time(), {}, Kind.COUNTER)]
        # A series is its name and labels (a plain tuple: hashed once a lookup, no enum in it).
        keys = [(p.name, tuple(p.labels.items()) if p.labels else ()) for p in points]
        request = telemetry_pb2.PushPackedRequest(
            values=_packed("d", [p.value for p in points]), sampled_at=_packed("d", [p.sampled_at for p in points])
        )
        for attempt in range(2):
            registry = self._registries.setdefault(address, _Registry())
            found = [registry.ids.get(k) for k in keys]
            if None in found:
                registry = await self._register(address, registry, keys, points, found)
                found = [registry.ids.get(k) for k in keys]
            request.registry_epoch = registry.epoch
            request.series_ids = _packed("q", found)  # type: ignore[arg-type]  # all registered now
            try:
                await self._collectors.get(address).push_packed(request)
                return
            except RpcError as err:
                if err.code not in _REGISTER_AGAIN or attempt:
                    raise
                logger.info("telemetry at %s answered %s: registering the series again", address, err.code.name)
                self._registries.pop(address, None)

    async def _register(
        self, address: str, registry: _Registry, keys: list[SeriesKey], points: list[Point], found: list[int | None]
    ) -> _Registry:
        """``registry`` with the series of ``keys`` not ``found`` registered (RegisterSeries).

        A new registry with all of them when another collector instance answers.
        """
        missing: dict[SeriesKey, Kind] = {}
        for key, point, sid in zip(keys, points, found, strict=True):
            if sid is None:
                missing.setdefault(key, point.kind)
        kinds = {name: kind for (name, _), kind in missing.items()}
        request = telemetry_pb2.RegisterSeriesRequest(
            series=[telemetry_pb2.SeriesKey(name=name, labels=dict(labels)) for name, labels in missing],
            common_labels=dict(self.options.common_labels),
            metadata=[telemetry_pb2.MetricMetadata(name=n, type=_KINDS[k]) for n, k in kinds.items()],
        )
        response = await self._collectors.get(address).register_series(request)
        if registry.ids and response.registry_epoch != registry.epoch:
            # Another instance answered (the collector restarted): the ids held are not its ids.
            self._registries[address] = fresh = _Registry()
            return await self._register(address, fresh, keys, points, [None] * len(keys))
        registry.epoch = response.registry_epoch
        registry.ids.update(zip(missing, response.series_ids, strict=True))
        return registry

    async def _find(self) -> str:
        if self._address or self._mgmtd is None:
            return self._address
        try:
            self._address = await self._mgmtd.service_address(common_pb2.NODE_TYPE_TELEMETRY)
        except RpcError as err:
            logger.debug("finding telemetry through mgmtd failed: %s", err)
        return self._address

    def _request(self, batch: list[Point], dropped: int) -> telemetry_pb2.PushSamplesRequest:
        sample = telemetry_pb2.Sample
        samples = [
            sample(name=p.name, labels=p.labels, value=p.value, sampled_at=p.sampled_at)
            if p.labels
            else sample(name=p.name, value=p.value, sampled_at=p.sampled_at)
            for p in batch
        ]
        kinds = {p.name: p.kind for p in batch if p.name not in self._described}
        if dropped:
            samples.append(telemetry_pb2.Sample(name=DROPPED_METRIC, value=float(dropped), sampled_at=time.time()))
            kinds.setdefault(DROPPED_METRIC, Kind.COUNTER)
        metadata = [telemetry_pb2.MetricMetadata(name=n, type=_KINDS[k]) for n, k in kinds.items()]
        return telemetry_pb2.PushSamplesRequest(
            samples=samples, common_labels=dict(self.options.common_labels), metadata=metadata
        )
