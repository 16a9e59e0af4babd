"""Telemetry ingest: samples/s into the collector with batches of 500, against a no-op RPC carrying the
same bytes, in interleaved rounds; then a sustained minute with every acknowledged sample counted in SQL.

A server process (``--serve``, started by this script) runs an in-process mgmtd (the registry), the real
collector (ff_telemetry, SQLite, its downsampling job on) and a no-op TelemetryService on the same
service runtime (tokens, interceptor, metrics) whose PushPacked and PushSamples only answer. The client
sends one pre-serialized request of 500 samples (50 metrics x 10 ranks, labels task/rank/node, no
timestamps: the collector stamps them, so every call is new samples) with ``--concurrency`` calls in
flight: with ``--protocol packed`` (the default) a PushPackedRequest of the ids RegisterSeries gave and
the values as packed arrays, with ``--protocol samples`` a PushSamplesRequest (one message per sample).
Rounds alternate which side goes first; the figure is the median of the per-round ratios collector/no-op
(goal >= 0.5). The sustained phase pushes for ``--sustain-s`` and then counts the rows
the collector holds: lost = acknowledged - stored.

    .venv/bin/python bench/telemetry_ingest.py                       # 3 rounds of 5 s, a minute sustained
    .venv/bin/python bench/telemetry_ingest.py --rounds 5 --round-s 10 --sustain-s 60 --dir /work/tmp
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import sqlalchemy as sa

BATCH = 500
SERVICE = "/fireflyer.telemetry.v1.TelemetryService/"
COMMON_LABELS = {"task_id": "7", "node": "bench-1"}
SERIES = [(f"bench_metric_{m}", {"rank": str(r)}) for m in range(50) for r in range(10)]
VALUES = [float(m * r) + 0.5 for m in range(50) for r in range(10)]


def batch_bytes() -> bytes:
    """A PushSamplesRequest of the batch (one message per sample)."""
    from fireflyer.telemetry.v1 import telemetry_pb2 as pb

    samples = [pb.Sample(name=n, labels=lb, value=v) for (n, lb), v in zip(SERIES, VALUES, strict=True)]
    assert len(samples) == BATCH
    return pb.PushSamplesRequest(samples=samples, common_labels=COMMON_LABELS).SerializeToString()


async def packed_batch_bytes(address: str, token: str) -> bytes:
    """A PushPackedRequest of the batch: its series registered with the collector at ``address``."""
    import numpy as np

    from fireflyer.telemetry.v1 import telemetry_pb2 as pb

    async with grpc.aio.insecure_channel(address) as channel:
        register = channel.unary_unary(
            SERVICE + "RegisterSeries", request_serializer=pb.RegisterSeriesRequest.SerializeToString,
            response_deserializer=pb.RegisterSeriesResponse.FromString,
        )  # fmt: skip
        keys = [pb.SeriesKey(name=n, labels=lb) for n, lb in SERIES]
        request = pb.RegisterSeriesRequest(series=keys, common_labels=COMMON_LABELS)
        got = await register(request, metadata=(("authorization", f"Bearer {token}"),), timeout=30)
    return pb.PushPackedRequest(
        registry_epoch=got.registry_epoch, series_ids=np.asarray(got.series_ids, "<i8").tobytes(),
        values=np.asarray(VALUES, "<f8").tobytes(),
    ).SerializeToString()  # fmt: skip


# -- server side ---------------------------------------------------------------------------------------
async def serve(folder: Path, synchronous: str = "NORMAL") -> None:
    from ff_rpc import RpcServer, ServerOptions, ServiceBinding
    from ff_telemetry.core.validation import MAX_REQUEST_BYTES
    from ff_testing.mgmtd import CLUSTER_TOKEN, start_in_process
    from ff_testing.telemetry import start_in_process as start_telemetry
    from fireflyer.telemetry.v1 import telemetry_pb2 as pb
    from fireflyer.telemetry.v1 import telemetry_pb2_grpc

    class NoopTelemetry(telemetry_pb2_grpc.TelemetryServiceServicer):
        async def PushSamples(self, request: pb.PushSamplesRequest, context: Any) -> pb.PushSamplesResponse:
            return pb.PushSamplesResponse(num_stored=len(request.samples))

        async def PushPacked(self, request: pb.PushPackedRequest, context: Any) -> pb.PushPackedResponse:
            return pb.PushPackedResponse(num_stored=len(request.values) // 8)

    mgmtd = await start_in_process(folder, f"sqlite:///{folder / 'mgmtd.db'}")
    db = folder / "telemetry.db"
    telemetry = await start_telemetry(
        folder, f"sqlite:///{db}", mgmtd.address, CLUSTER_TOKEN, scrape_interval_s=0.0,
        downsample_interval_s=10.0, downsample_lag_s=5.0, metrics_address="", log_level="WARNING",
        sqlite_synchronous=synchronous,
    )  # fmt: skip
    noop = RpcServer(
        ServerOptions(listen_address="127.0.0.1:0", cluster_token=CLUSTER_TOKEN, max_request_bytes=MAX_REQUEST_BYTES),
        [
            ServiceBinding(
                "fireflyer.telemetry.v1.TelemetryService",
                telemetry_pb2_grpc.add_TelemetryServiceServicer_to_server,
                NoopTelemetry(),  # type: ignore[abstract]  # the other RPCs answer UNIMPLEMENTED (base class)
            )
        ],
    )
    await noop.start()
    info = {"telemetry": telemetry.address, "noop": noop.address, "db": str(db), "token": CLUSTER_TOKEN}
    (folder / "bench.json").write_text(json.dumps(info))
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await noop.stop(0)
    await telemetry.shutdown()
    await mgmtd.shutdown()


# -- client side ---------------------------------------------------------------------------------------
async def push_for(
    address: str, token: str, payload: bytes, seconds: float, concurrency: int, method: str = "PushPacked"
) -> tuple[int, float]:
    """Pushes ``payload`` to ``method`` for ``seconds``; (samples acknowledged, elapsed s)."""
    from fireflyer.telemetry.v1 import telemetry_pb2 as pb

    # PushPackedResponse and PushSamplesResponse both start with num_stored = 1.
    async with grpc.aio.insecure_channel(address) as channel:
        call = channel.unary_unary(
            SERVICE + method, request_serializer=lambda b: b, response_deserializer=pb.PushPackedResponse.FromString
        )
        metadata = (("authorization", f"Bearer {token}"),)
        acked = 0
        start = time.perf_counter()
        deadline = start + seconds

        async def worker() -> None:
            nonlocal acked
            while time.perf_counter() < deadline:
                resp = await call(payload, metadata=metadata, timeout=30)
                acked += resp.num_stored

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return acked, time.perf_counter() - start


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (/proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stored_rows(db: str) -> int:
    engine = sa.create_engine(f"sqlite:///{db}")
    try:
        with engine.connect() as conn:
            return int(conn.execute(sa.text("SELECT COALESCE(SUM(count), 0) FROM tel_sample_blocks")).scalar_one())
    finally:
        engine.dispose()


async def client(info: dict[str, str], args: argparse.Namespace, server_pid: int) -> None:
    if args.protocol == "packed":
        payload, method = await packed_batch_bytes(info["telemetry"], info["token"]), "PushPacked"
    else:
        payload, method = batch_bytes(), "PushSamples"
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"{method}: {BATCH} samples, {len(payload)} bytes a request; {args.concurrency} calls in flight; "
          f"SQLite synchronous={args.synchronous}; load average {load}")  # fmt: skip

    async def push(side: str, seconds: float) -> tuple[int, float]:
        return await push_for(info[side], info["token"], payload, seconds, args.concurrency, method)

    await push("noop", 1.0)  # warm both up
    await push("telemetry", 1.0)
    ratios, cpu_ratios = [], []
    for r in range(args.rounds):
        order = ["noop", "telemetry"] if r % 2 == 0 else ["telemetry", "noop"]
        rates, cpu_per_k = {}, {}
        for side in order:
            cpu_before = cpu_s(server_pid)
            acked, elapsed = await push(side, args.round_s)
            rates[side] = acked / elapsed
            cpu_per_k[side] = (cpu_s(server_pid) - cpu_before) / acked * 1e6  # server CPU ms per 1000 samples
        ratios.append(rates["telemetry"] / rates["noop"])
        cpu_ratios.append(cpu_per_k["noop"] / cpu_per_k["telemetry"])
        tel, noop = rates["telemetry"], rates["noop"]
        print(f"round {r + 1}: collector {tel:,.0f} samples/s ({cpu_per_k['telemetry']:.2f} ms server CPU per 1000), "
              f"no-op {noop:,.0f} samples/s ({cpu_per_k['noop']:.2f} ms), ratio {ratios[-1]:.2f}")  # fmt: skip
    print(f"median ratio collector/no-op over {args.rounds} rounds: {statistics.median(ratios):.2f} (goal >= 0.5); "
          f"by server CPU per sample: {statistics.median(cpu_ratios):.2f}")  # fmt: skip
    before = stored_rows(info["db"])
    acked, elapsed = await push("telemetry", args.sustain_s)
    stored = stored_rows(info["db"]) - before
    print(f"sustained {elapsed:.0f} s: {acked / elapsed:,.0f} samples/s; acknowledged {acked:,}, stored {stored:,}, "
          f"lost {acked - stored:,}")  # fmt: skip
    print(f"load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


@contextmanager
def bench_server(folder: Path, synchronous: str = "NORMAL") -> Iterator[tuple[dict[str, str], int]]:
    """The ``--serve`` process (mgmtd, the collector, the no-op) with its state in ``folder``: where it
    listens (``telemetry``, ``noop``, ``db``, ``token``) and its pid; stopped on exit."""
    command = [sys.executable, __file__, "--serve", str(folder), "--synchronous", synchronous]
    server = subprocess.Popen(command, env={**os.environ})
    try:
        ready = folder / "bench.json"
        deadline = time.monotonic() + 60
        while not ready.exists():
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the bench server did not start")
            time.sleep(0.1)
        yield json.loads(ready.read_text()), server.pid
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--round-s", type=float, default=5.0)
    parser.add_argument("--sustain-s", type=float, default=60.0)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--protocol", choices=("packed", "samples"), default="packed")
    parser.add_argument("--dir", type=Path, default=None, help="where the server keeps its state (default: a temp dir)")
    parser.add_argument("--synchronous", choices=("NORMAL", "FULL"), default="NORMAL", help="the collector's SQLite")
    parser.add_argument("--serve", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        asyncio.run(serve(args.serve, args.synchronous))
        return
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp, bench_server(Path(tmp), args.synchronous) as (info, pid):
        asyncio.run(client(info, args, pid))


if __name__ == "__main__":
    main()
