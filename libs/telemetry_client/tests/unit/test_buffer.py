from __future__ import annotations

import math
import threading

import pytest

from ff_telemetry_client import BackgroundPusher, Kind, PushOptions, SampleBuffer, TelemetryPusher
from ff_telemetry_client.pusher import DROPPED_METRIC
from fireflyer.telemetry.v1 import telemetry_pb2


def test_full_buffer_drops_the_oldest_and_counts_it() -> None:
    buf = SampleBuffer(capacity=3)
    for i in range(5):
        buf.add("x", i, sampled_at=float(i))
    assert buf.dropped == 2
    assert [p.value for p in buf.take(10)] == [2.0, 3.0, 4.0]
    assert len(buf) == 0


def test_put_back_goes_first_and_keeps_the_newest_that_fit() -> None:
    buf = SampleBuffer(capacity=4)
    for i in range(4):
        buf.add("x", i)
    batch = buf.take(3)
    buf.add("x", 10)
    buf.add("x", 11)  # 3 in the buffer now: room for one of the three taken
    buf.put_back(batch)
    assert [p.value for p in buf.take(10)] == [2.0, 3.0, 10.0, 11.0]
    assert buf.dropped == 2


def test_adds_from_many_threads_lose_nothing_but_what_is_counted() -> None:
    buf = SampleBuffer(capacity=1000)

    def writer() -> None:
        for i in range(500):
            buf.add("x", i)

    threads = [threading.Thread(target=writer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(buf) + buf.dropped == 2000
    assert len(buf) == 1000


def test_non_finite_values_are_kept() -> None:
    buf = SampleBuffer()
    buf.add("loss", float("nan"))
    buf.add("loss", float("inf"))
    values = [p.value for p in buf.take(2)]
    assert math.isnan(values[0]) and values[1] == math.inf


def test_bad_options_are_refused() -> None:
    with pytest.raises(ValueError, match="telemetry address or mgmtd"):
        PushOptions(token="t")
    with pytest.raises(ValueError, match="batch_size"):
        PushOptions(token="t", address="a:1", batch_size=0)
    with pytest.raises(ValueError, match="capacity"):
        SampleBuffer(capacity=0)


def test_request_carries_labels_types_once_and_the_drop_count() -> None:
    buf = SampleBuffer(capacity=2)
    pusher = TelemetryPusher(PushOptions(token="t", address="a:1", common_labels={"node": "n1"}), buf)
    for i in range(3):
        buf.add("steps", i, {"rank": "0"}, kind=Kind.COUNTER)
    batch = buf.take(10)
    req = pusher._request(batch, buf.dropped)
    assert dict(req.common_labels) == {"node": "n1"}
    assert [(s.name, s.value) for s in req.samples] == [("steps", 1.0), ("steps", 2.0), (DROPPED_METRIC, 1.0)]
    assert dict(req.samples[0].labels) == {"rank": "0"}
    types = {m.name: m.type for m in req.metadata}
    assert types == {"steps": telemetry_pb2.METRIC_TYPE_COUNTER, DROPPED_METRIC: telemetry_pb2.METRIC_TYPE_COUNTER}


def test_a_pusher_sends_the_buffer_it_is_given_even_an_empty_one() -> None:
    buf = SampleBuffer()  # empty, so falsy: it must still be the one pushed
    options = PushOptions(token="t", address="a:1")
    assert TelemetryPusher(options, buf).buffer is buf
    assert BackgroundPusher(options, buf).buffer is buf


def test_add_many_shares_labels_and_time_and_drops_the_oldest() -> None:
    buf = SampleBuffer(capacity=4)
    buf.add("x", 0)
    buf.add_many([("a", 1.0), ("b", 2.0)], {"rank": "0"}, sampled_at=5.0)
    assert [(p.name, p.value, p.sampled_at, dict(p.labels)) for p in buf.take(2)][1] == ("a", 1.0, 5.0, {"rank": "0"})
    buf.add_many([(f"m{i}", float(i)) for i in range(6)], {})  # 1 left + 6 new into 4: 3 dropped
    assert [p.name for p in buf.take(10)] == ["m2", "m3", "m4", "m5"]
    assert buf.dropped == 3
