"""The pusher against a real collector found through a real mgmtd: while telemetry is not there the buffer
keeps the newest samples and counts the rest; once it is, they arrive with the drop count as a counter."""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path

from ff_telemetry_client import DROPPED_METRIC, Kind, PushOptions, SampleBuffer, TelemetryPusher
from ff_testing.mgmtd import CLUSTER_TOKEN, running_with_users
from ff_testing.telemetry import TelemetryClient
from ff_testing.telemetry import start_in_process as start_telemetry
from fireflyer.telemetry.v1 import telemetry_pb2 as pb


async def _last_values(client: TelemetryClient, name: str) -> list[float]:
    now = time.time()
    req = pb.QueryRangeRequest(name=name, start_at=now - 60, end_at=now, step_s=1.0)
    return [s.points[-1].value for s in (await client.call(client.stub.QueryRange, req)).series if s.points]


async def test_samples_wait_for_telemetry_and_drops_arrive_as_a_counter(tmp_path: Path) -> None:
    async with running_with_users(tmp_path, f"sqlite:///{tmp_path / 'mgmtd.db'}") as (mgmtd, tokens):
        buffer = SampleBuffer(capacity=5)
        options = PushOptions(token=tokens["alice"], mgmtd_addresses=[mgmtd.address], common_labels={"job": "t"})
        pusher = TelemetryPusher(options, buffer)
        try:
            for i in range(8):
                buffer.add("steps_done", i, {"rank": "0"}, kind=Kind.COUNTER, sampled_at=time.time() - 8 + i)
            assert not await pusher.flush()  # no telemetry registered yet: nothing sent, nothing lost but 3
            assert (len(buffer), buffer.dropped) == (5, 3)
            telemetry = await start_telemetry(tmp_path, f"sqlite:///{tmp_path / 't.db'}", mgmtd.address, CLUSTER_TOKEN)
            client = TelemetryClient(telemetry.address, tokens["alice"])
            try:
                for _ in range(50):  # until telemetry has registered with mgmtd
                    if await pusher.flush() and pusher.num_pushed:
                        break
                    await asyncio.sleep(0.1)
                assert pusher.num_pushed == 5 and len(buffer) == 0
                assert await _last_values(client, "steps_done") == [7.0]
                assert await _last_values(client, DROPPED_METRIC) == [3.0]
            finally:
                await client.close()
                await telemetry.shutdown()
        finally:
            await pusher.close()


async def test_a_collector_restart_makes_the_pusher_register_again_and_lose_nothing(tmp_path: Path) -> None:
    async with running_with_users(tmp_path, f"sqlite:///{tmp_path / 'mgmtd.db'}") as (mgmtd, tokens):
        db = f"sqlite:///{tmp_path / 't.db'}"
        telemetry = await start_telemetry(tmp_path, db, mgmtd.address, CLUSTER_TOKEN)
        pusher = TelemetryPusher(PushOptions(token=tokens["alice"], address=telemetry.address))
        t0 = time.time() - 10
        try:
            pusher.buffer.add("loss", 0.5, {"rank": "0"}, sampled_at=t0)
            assert await pusher.flush() and pusher.num_pushed == 1
            (registry,) = pusher._registries.values()
            first_epoch = registry.epoch
            await telemetry.shutdown()  # a new instance on the same address and database: the ids it gave are
            telemetry = await start_telemetry(  # not its own, so it refuses them and the pusher registers again
                tmp_path, db, mgmtd.address, CLUSTER_TOKEN, listen_address=telemetry.address
            )
            pusher.buffer.add("loss", float("nan"), {"rank": "0"}, sampled_at=t0 + 1)
            pusher.buffer.add("tokens", 7.0, {"rank": "0"}, sampled_at=t0 + 1)
            assert await pusher.flush() and pusher.num_pushed == 3 and pusher.buffer.dropped == 0
            assert pusher._registries[telemetry.address].epoch != first_epoch
            client = TelemetryClient(telemetry.address, tokens["alice"])
            try:
                req = pb.QueryRangeRequest(name="loss", start_at=t0, end_at=t0 + 1, step_s=1.0, lookback_s=0.5)
                (series,) = (await client.call(client.stub.QueryRange, req)).series
                assert [p.at - t0 for p in series.points] == [0.0, 1.0]
                assert series.points[0].value == 0.5 and math.isnan(series.points[1].value)
                assert await _last_values(client, "tokens") == [7.0]
            finally:
                await client.close()
        finally:
            await pusher.close()
            await telemetry.shutdown()
