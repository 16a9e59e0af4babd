"""The collector as a real service on port 0 (with a real mgmtd): pushes, range queries, rates and
quantiles, tenancy, bad input refused with a clear status and nothing stored, the downsampling job,
scraping the services mgmtd knows, and /federate. One cluster for the module (SQLite)."""

from __future__ import annotations

import itertools
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import grpc
import numpy as np
import pytest
import pytest_asyncio

from ff_rpc import RpcError
from ff_testing.mgmtd import CLUSTER_TOKEN, running_with_users
from ff_testing.telemetry import InProcessTelemetry, TelemetryClient, start_in_process
from ff_testing.waiting import eventually
from fireflyer.telemetry.v1 import telemetry_pb2 as pb

pytestmark = pytest.mark.asyncio(loop_scope="module")
MAX_SERIES = 300


@dataclass
class Env:
    telemetry: InProcessTelemetry
    tokens: dict[str, str]
    clients: dict[str, TelemetryClient] = field(default_factory=dict)

    def client(self, who: str) -> TelemetryClient:
        if who not in self.clients:
            token = CLUSTER_TOKEN if who == "cluster" else self.tokens[who]
            self.clients[who] = TelemetryClient(self.telemetry.address, token)
        return self.clients[who]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def env(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Env]:
    folder = Path(tmp_path_factory.mktemp("telemetry"))
    async with running_with_users(folder, f"sqlite:///{folder / 'mgmtd.db'}") as (mgmtd, tokens):
        telemetry = await start_in_process(
            folder,
            f"sqlite:///{folder / 'telemetry.db'}",
            mgmtd.address,
            CLUSTER_TOKEN,
            max_series_per_metric=MAX_SERIES,
            raw_retention_s=3 * 3600.0,
        )
        e = Env(telemetry, tokens)
        try:
            yield e
        finally:
            for c in e.clients.values():
                await c.close()
            await telemetry.shutdown()


async def push(env: Env, who: str, *samples: pb.Sample, **kw: object) -> pb.PushSamplesResponse:
    c = env.client(who)
    return await c.call(c.stub.PushSamples, pb.PushSamplesRequest(samples=samples, **kw))  # type: ignore[arg-type]


async def query(env: Env, who: str, **kw: object) -> pb.QueryRangeResponse:
    c = env.client(who)
    return await c.call(c.stub.QueryRange, pb.QueryRangeRequest(**kw))  # type: ignore[arg-type]


async def series_count(env: Env, name: str = "") -> int:
    """Pushed series (not the scraped ones: a refused call is counted in the service's own /metrics, which
    is scraped at any moment)."""
    c = env.client("root")
    pushed_only = [pb.LabelMatcher(name="job", op=pb.MATCH_OP_EQUAL, value="")]
    return len((await c.call(c.stub.ListSeries, pb.ListSeriesRequest(name=name, matchers=pushed_only))).series)


async def test_a_users_series_are_theirs_and_other_users_do_not_see_them(env: Env) -> None:
    now = time.time()
    got = await push(
        env, "alice", pb.Sample(name="loss", labels={"task_id": "1", "user": "bob"}, value=0.5, sampled_at=now)
    )
    assert (got.num_stored, got.num_new_series) == (1, 1)
    await push(env, "bob", pb.Sample(name="loss", labels={"task_id": "2"}, value=0.7, sampled_at=now))
    await push(env, "cluster", pb.Sample(name="loss", labels={"node": "n1"}, value=9.0, sampled_at=now))

    async def seen(who: str) -> dict[str, float]:
        resp = await query(env, who, name="loss", start_at=now, end_at=now, step_s=1)
        return {s.labels.get("user", "-"): s.points[0].value for s in resp.series}

    assert await seen("alice") == {"alice": 0.5, "-": 9.0}  # alice's push is hers even when she says "bob"
    assert await seen("bob") == {"bob": 0.7, "-": 9.0}
    assert await seen("root") == {"alice": 0.5, "bob": 0.7, "-": 9.0}
    c = env.client("bob")
    listed = await c.call(c.stub.ListSeries, pb.ListSeriesRequest(name="loss"))
    assert sorted(s.labels.get("user", "-") for s in listed.series) == ["-", "bob"]


async def test_rate_and_aggregation_of_a_counter(env: Env) -> None:
    t0 = time.time() - 100
    meta = [pb.MetricMetadata(name="steps_total", type=pb.METRIC_TYPE_COUNTER, help="steps")]
    samples = [
        pb.Sample(name="steps_total", labels={"rank": str(r)}, value=float(i * 10 * (r + 1)), sampled_at=t0 + i * 10)
        for r in range(2)
        for i in range(10)
    ]
    await push(env, "cluster", *samples, metadata=meta)
    resp = await query(
        env,
        "alice",
        name="steps_total",
        start_at=t0 + 50,
        end_at=t0 + 90,
        step_s=40,
        lookback_s=40,
        rate=True,
        aggregation=pb.AGGREGATION_SUM,
    )
    (series,) = resp.series
    assert [(p.at - t0, p.value) for p in series.points] == [(50.0, 3.0), (90.0, 3.0)]  # 1/s + 2/s
    assert resp.resolution_s == 0


async def test_quantile_of_a_pushed_histogram(env: Env) -> None:
    t0 = time.time() - 20
    meta = [pb.MetricMetadata(name="step_seconds", type=pb.METRIC_TYPE_HISTOGRAM)]
    counts = {"0.1": (0, 10), "0.5": (0, 60), "1": (0, 100), "+Inf": (0, 100)}
    samples = [
        pb.Sample(name="step_seconds_bucket", labels={"le": le}, value=float(c), sampled_at=t0 + 10 * i)
        for le, pair in counts.items()
        for i, c in enumerate(pair)
    ]
    await push(env, "cluster", *samples, metadata=meta)
    resp = await query(
        env, "bob", name="step_seconds", start_at=t0 + 10, end_at=t0 + 10, step_s=1, lookback_s=30, quantile=0.5
    )
    assert resp.series[0].points[0].value == pytest.approx(0.42)


@pytest.mark.parametrize(
    ("request_kw", "code", "detail"),
    [
        ({"samples": [pb.Sample(name="bad name", value=1)]}, grpc.StatusCode.INVALID_ARGUMENT, "bad metric name"),
        ({"samples": [pb.Sample(name="x", labels={"0bad": "v"}, value=1)]},
         grpc.StatusCode.INVALID_ARGUMENT, "bad label name"),
        ({"samples": [pb.Sample(name="x", value=1)], "metadata": [pb.MetricMetadata(name="x", type=7)]},
         grpc.StatusCode.INVALID_ARGUMENT, "unknown metric type 7"),
        ({"samples": [pb.Sample(name="c_total", value=float("nan"))],
          "metadata": [pb.MetricMetadata(name="c_total", type=pb.METRIC_TYPE_COUNTER)]},
         grpc.StatusCode.INVALID_ARGUMENT, "must be finite"),
        ({"samples": [pb.Sample(name="x", value=1, sampled_at=1.0)]}, grpc.StatusCode.INVALID_ARGUMENT, "outside"),
        ({"samples": [pb.Sample(name="card", labels={"id": str(i)}, value=1) for i in range(MAX_SERIES + 1)]},
         grpc.StatusCode.RESOURCE_EXHAUSTED, "the limit is 300"),
    ],
)  # fmt: skip
async def test_bad_pushes_are_refused_and_store_nothing(
    env: Env, request_kw: dict[str, object], code: grpc.StatusCode, detail: str
) -> None:
    before = await series_count(env)
    good = pb.Sample(name="fine", labels={"case": detail}, value=1.0)
    with pytest.raises(RpcError) as err:
        await push(env, "cluster", good, *request_kw["samples"], metadata=request_kw.get("metadata", []))  # type: ignore[misc]
    assert err.value.code is code and detail in err.value.details
    assert await series_count(env) == before  # not even the good sample
    assert (await push(env, "cluster", good)).num_stored == 1  # and the service goes on


@pytest.mark.parametrize(
    ("request_kw", "detail"),
    [
        ({"name": "x", "start_at": 0, "end_at": 1e6, "step_s": 1}, "more than 11000 steps"),
        ({"name": "x", "start_at": 2, "end_at": 1, "step_s": 1}, "end_at >= start_at"),
        ({"name": "x", "start_at": 1, "end_at": 1, "step_s": 1,
          "matchers": [pb.LabelMatcher(name="a", op=pb.MATCH_OP_REGEX, value="(")]}, "bad regular expression"),
        ({"name": "x", "start_at": 1, "end_at": 1, "step_s": 1, "resolution_s": 7}, "resolution_s"),
        ({"name": "x", "start_at": 1, "end_at": 1, "step_s": 1, "quantile": 0.5, "rate": True}, "quantile"),
    ],
)  # fmt: skip
async def test_bad_queries_are_invalid_argument(env: Env, request_kw: dict[str, object], detail: str) -> None:
    with pytest.raises(RpcError) as err:
        await query(env, "alice", **request_kw)
    assert err.value.code is grpc.StatusCode.INVALID_ARGUMENT and detail in err.value.details


async def test_no_token_is_unauthenticated(env: Env) -> None:
    c = TelemetryClient(env.telemetry.address, "fft_0000000000000000_notarealtokennotarealtokennotarealtoken00")
    try:
        with pytest.raises(RpcError) as err:
            await c.call(c.stub.PushSamples, pb.PushSamplesRequest(samples=[pb.Sample(name="x", value=1)]))
        assert err.value.code is grpc.StatusCode.UNAUTHENTICATED
    finally:
        await c.close()


async def test_the_job_downsamples_and_the_minute_tier_keeps_the_increase(env: Env) -> None:
    t0 = (time.time() // 3600 - 2) * 3600  # two hours ago, on the hour
    meta = [pb.MetricMetadata(name="bytes_total", type=pb.METRIC_TYPE_COUNTER)]
    values = [float(i * i) for i in range(120)]  # a minute apart
    samples = [pb.Sample(name="bytes_total", value=v, sampled_at=t0 + 60 * i + 1) for i, v in enumerate(values)]
    await push(env, "cluster", *samples, metadata=meta)
    end = t0 + 7200

    async def downsampled() -> bool:
        resp = await query(
            env,
            "root",
            name="bytes_total",
            start_at=end,
            end_at=end,
            step_s=1,
            lookback_s=7200,
            rate=True,
            resolution_s=60,
        )
        return bool(resp.series) and resp.series[0].points[0].value * 7200 == pytest.approx(values[-1])

    await eventually(downsampled, what="the 1-minute tier to hold the counter's increase")

    async def rolled_up() -> bool:
        resp = await query(
            env,
            "root",
            name="bytes_total",
            start_at=end,
            end_at=end,
            step_s=1,
            lookback_s=7200,
            rate=True,
            resolution_s=3600,
        )
        return bool(resp.series) and resp.series[0].points[0].value * 7200 == pytest.approx(values[-1])

    await eventually(rolled_up, what="the 1-hour tier to hold the counter's increase")


async def test_it_scrapes_the_services_mgmtd_knows(env: Env) -> None:
    c = env.client("root")

    async def scraped() -> bool:
        resp = await c.call(c.stub.ListSeries, pb.ListSeriesRequest(name="ff_rpc_requests_total"))
        return {"mgmtd", "telemetry"} <= {s.labels["job"] for s in resp.series}

    await eventually(scraped, what="mgmtd's and telemetry's own /metrics scraped")
    resp = await c.call(c.stub.ListSeries, pb.ListSeriesRequest(name="ff_rpc_requests_total"))
    assert all(s.type == pb.METRIC_TYPE_COUNTER and s.labels["instance"] for s in resp.series)


async def test_list_series_pages_and_refuses_a_bad_token(env: Env) -> None:
    now = time.time()
    await push(
        env, "cluster", *[pb.Sample(name="paged", labels={"i": str(i)}, value=1, sampled_at=now) for i in range(5)]
    )
    c, seen, token = env.client("alice"), [], ""
    while True:
        page = await c.call(c.stub.ListSeries, pb.ListSeriesRequest(name="paged", page_size=2, page_token=token))
        seen += [s.labels["i"] for s in page.series]
        token = page.next_page_token
        if not token:
            break
        assert len(page.series) == 2
    assert sorted(seen) == ["0", "1", "2", "3", "4"]
    with pytest.raises(RpcError) as err:
        await c.call(c.stub.ListSeries, pb.ListSeriesRequest(name="paged", page_token="abc"))
    assert err.value.code is grpc.StatusCode.INVALID_ARGUMENT


async def test_federate_exposes_what_it_holds_to_whom_may_see_it(env: Env) -> None:
    now = time.time()
    await push(env, "alice", pb.Sample(name="fed_loss", value=1.25, sampled_at=now))
    await push(env, "bob", pb.Sample(name="fed_loss", value=2.5, sampled_at=now))
    url = f"http://{env.telemetry.http_address}/federate"
    async with aiohttp.ClientSession() as http:
        async with http.get(url) as resp:
            assert resp.status == 401
        async with http.get(url, headers={"Authorization": "Bearer fft_0000000000000000_no"}) as resp:
            assert resp.status == 401
        async with http.get(url, headers={"Authorization": f"Bearer {env.tokens['alice']}"}) as resp:
            text = await resp.text()
            assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert "# TYPE fed_loss gauge" in text and 'fed_loss{user="alice"} 1.25 ' in text
    assert 'user="bob"' not in text


# -- packed pushes (RegisterSeries + PushPacked) -------------------------------------------------------
def packed(typecode: str, items: list[float] | list[int]) -> bytes:
    return np.asarray(items, dtype="<i8" if typecode == "q" else "<f8").tobytes()


async def register(env: Env, who: str, *keys: pb.SeriesKey, **kw: object) -> pb.RegisterSeriesResponse:
    c = env.client(who)
    return await c.call(c.stub.RegisterSeries, pb.RegisterSeriesRequest(series=keys, **kw))  # type: ignore[arg-type]


async def push_packed(env: Env, who: str, **kw: object) -> pb.PushPackedResponse:
    c = env.client(who)
    return await c.call(c.stub.PushPacked, pb.PushPackedRequest(**kw))  # type: ignore[arg-type]


async def test_packed_push_stores_the_values_in_order_nan_included(env: Env) -> None:
    keys = [pb.SeriesKey(name="pk_loss", labels={"rank": str(r)}) for r in range(2)]
    first = await register(env, "alice", *keys, common_labels={"task_id": "9"})
    again = await register(env, "alice", *keys, common_labels={"task_id": "9"})
    assert list(again.series_ids) == list(first.series_ids) and again.registry_epoch == first.registry_epoch
    assert (first.num_new_series, again.num_new_series) == (2, 0)
    t0 = time.time() - 10
    values = [0.9, 0.8, float("nan"), 0.6]  # a NaN loss is stored (the loss-NaN alert reads it)
    got = await push_packed(
        env,
        "alice",
        registry_epoch=first.registry_epoch,
        series_ids=packed("q", [first.series_ids[0]] * 4),
        values=packed("d", values),
        sampled_at=packed("d", [t0 + i for i in range(4)]),
    )
    assert got.num_stored == 4
    await push_packed(
        env,
        "alice",
        registry_epoch=first.registry_epoch,
        series_ids=packed("q", [first.series_ids[1]]),
        values=packed("d", [2.0]),
    )
    resp = await query(env, "alice", name="pk_loss", start_at=t0, end_at=t0 + 3, step_s=1, lookback_s=0.5)
    by_rank = {s.labels["rank"]: s for s in resp.series}
    assert dict(by_rank["0"].labels) == {"rank": "0", "task_id": "9", "user": "alice"}
    assert [p.at - t0 for p in by_rank["0"].points] == [0.0, 1.0, 2.0, 3.0]
    assert np.array_equal([p.value for p in by_rank["0"].points], values, equal_nan=True)
    now = time.time()
    latest = await query(env, "alice", name="pk_loss", start_at=now, end_at=now, step_s=1, lookback_s=60)
    assert sorted(s.points[-1].value for s in latest.series if s.labels["rank"] == "1") == [2.0]  # now-stamped
    assert not (await query(env, "bob", name="pk_loss", start_at=t0, end_at=now, step_s=1)).series


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def packed_series(env: Env) -> dict[str, object]:
    """alice's gauge, a cluster counter: ids and the epoch."""
    alice = await register(env, "alice", pb.SeriesKey(name="pk_gauge"))
    meta = [pb.MetricMetadata(name="pk_total", type=pb.METRIC_TYPE_COUNTER)]
    cluster = await register(env, "cluster", pb.SeriesKey(name="pk_total"), metadata=meta)
    return {"epoch": alice.registry_epoch, "alice": alice.series_ids[0], "counter": cluster.series_ids[0]}


PACKED_T0 = float(int(time.time()) - 600)  # the good pushes of the bad-input tests: one a second from here
_good_pushes = itertools.count()


async def _points(env: Env) -> int:
    """Seconds from PACKED_T0 to 5 min ahead with a sample of the packed test series."""
    total = 0
    for name in ("pk_gauge", "pk_total"):
        resp = await query(
            env, "root", name=name, start_at=PACKED_T0, end_at=time.time() + 300, step_s=1, lookback_s=0.5
        )
        total += sum(len(s.points) for s in resp.series)
    return total


BAD_PACKED = [
    # (who, fields given as functions of the ids, code, detail)
    ("alice", lambda p: {"series_ids": packed("q", [p["alice"], 10**9]), "values": packed("d", [1, 2])},
     grpc.StatusCode.NOT_FOUND, "not registered"),
    ("alice", lambda p: {"series_ids": packed("q", [p["alice"], -1]), "values": packed("d", [1, 2])},
     grpc.StatusCode.NOT_FOUND, "not registered"),
    ("bob", lambda p: {"series_ids": packed("q", [p["alice"]]), "values": packed("d", [1])},
     grpc.StatusCode.PERMISSION_DENIED, "not one of 'bob'"),
    ("alice", lambda p: {"series_ids": packed("q", [p["alice"], p["counter"]]), "values": packed("d", [1, 2])},
     grpc.StatusCode.PERMISSION_DENIED, "not one of 'alice'"),
    ("cluster", lambda p: {"series_ids": packed("q", [p["alice"]]), "values": packed("d", [1]), "registry_epoch": 7},
     grpc.StatusCode.FAILED_PRECONDITION, "register again"),
    ("alice", lambda p: {"series_ids": packed("q", [p["alice"]] * 2), "values": packed("d", [1])},
     grpc.StatusCode.INVALID_ARGUMENT, "2 series ids but 1 values"),
    ("alice", lambda p: {"series_ids": packed("q", [p["alice"]]), "values": packed("d", [1]) + b"\0"},
     grpc.StatusCode.INVALID_ARGUMENT, "not a whole number of 8-byte items"),
    ("alice", lambda p: {"series_ids": packed("q", [p["alice"]]), "values": packed("d", [1]),
                         "sampled_at": packed("d", [time.time()] * 2)},
     grpc.StatusCode.INVALID_ARGUMENT, "1 series ids but 2 times"),
    ("alice", lambda p: {"series_ids": packed("q", [p["alice"]]), "values": packed("d", [1]),
                         "sampled_at": packed("d", [float("nan")])},
     grpc.StatusCode.INVALID_ARGUMENT, "outside"),
    ("cluster", lambda p: {"series_ids": packed("q", [p["alice"], p["counter"]]),
                           "values": packed("d", [1.0, float("inf")])},
     grpc.StatusCode.INVALID_ARGUMENT, "must be finite and >= 0"),
    ("cluster", lambda p: {"series_ids": packed("q", [p["counter"]]), "values": packed("d", [-1.0])},
     grpc.StatusCode.INVALID_ARGUMENT, "must be finite and >= 0"),
    ("alice", lambda p: {"series_ids": packed("q", [p["alice"]] * 10_001), "values": packed("d", [1.0] * 10_001)},
     grpc.StatusCode.INVALID_ARGUMENT, "10001 samples in one call"),
    ("alice", lambda p: {"series_ids": packed("q", [p["alice"]] * 600_000), "values": packed("d", [1.0] * 600_000)},
     grpc.StatusCode.RESOURCE_EXHAUSTED, "larger than max"),
]  # fmt: skip


@pytest.mark.parametrize(("who", "fields", "code", "detail"), BAD_PACKED)
async def test_bad_packed_pushes_are_refused_and_store_nothing(
    env: Env,
    packed_series: dict[str, int],
    who: str,
    fields: Callable[[dict[str, int]], dict[str, object]],
    code: grpc.StatusCode,
    detail: str,
) -> None:
    before = await _points(env)
    request = {"registry_epoch": packed_series["epoch"], **fields(packed_series)}
    with pytest.raises(RpcError) as err:
        await push_packed(env, who, **request)
    assert err.value.code is code and detail in err.value.details
    assert await _points(env) == before
    good = {
        "registry_epoch": packed_series["epoch"],
        "series_ids": packed("q", [packed_series["alice"]]),
        "values": packed("d", [3.0]),
        "sampled_at": packed("d", [PACKED_T0 + next(_good_pushes)]),
    }
    assert (await push_packed(env, "alice", **good)).num_stored == 1  # and the service goes on
    assert await _points(env) == before + 1


@pytest.mark.parametrize(
    ("keys", "code", "detail"),
    [
        ([pb.SeriesKey(name="bad name")], grpc.StatusCode.INVALID_ARGUMENT, "bad metric name"),
        ([pb.SeriesKey(name="pk_ok"), pb.SeriesKey(name="x", labels={"0bad": "v"})],
         grpc.StatusCode.INVALID_ARGUMENT, "bad label name"),
        ([pb.SeriesKey(name="pk_card", labels={"id": str(i)}) for i in range(MAX_SERIES + 1)],
         grpc.StatusCode.RESOURCE_EXHAUSTED, "the limit is 300"),
    ],
)  # fmt: skip
async def test_bad_registrations_are_refused_and_store_nothing(
    env: Env, keys: list[pb.SeriesKey], code: grpc.StatusCode, detail: str
) -> None:
    before = await series_count(env)
    with pytest.raises(RpcError) as err:
        await register(env, "alice", *keys)
    assert err.value.code is code and detail in err.value.details
    assert await series_count(env) == before
    assert len((await register(env, "alice", pb.SeriesKey(name="pk_ok"))).series_ids) == 1
