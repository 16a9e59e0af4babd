"""Hostile input to every storage RPC: boundary and oversized values, repeated entries, huge counts, bad ids,
malformed bytes. Each is answered with its intended status, before any work: the storage process's peak
memory grows by less than a bound per request (VmHWM in /proc/<pid>/status, reset before each), each
answer comes in bounded time, nothing is written, and the node still serves a normal write and read after
each."""

from __future__ import annotations

import asyncio
import json
import os
import struct
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio

from ff_fsprotocol.datapath import DATA_PATH_VERSION, DataConnection, DataRefused
from ff_rpc import RpcClient, RpcError, open_channel
from ff_storage.config import StorageSettings
from ff_testing.cluster import CLUSTER_TOKEN, StorageCluster, start_cluster
from ff_testing.hostile import MALFORMED_MESSAGES, call_raw, peak_rss_kib, rss_kib
from fireflyer.mgmtd.v1 import mgmtd_pb2 as mpb
from fireflyer.storage.v1 import storage_pb2 as spb
from fireflyer.storage.v1 import storage_pb2_grpc
from hf3fs import ChunkRead, ChunkWrite, StorageClient, crc32c_of

BIG = 16 << 20  # the largest IO a node takes by default
MAX_PEAK_GROWTH_BYTES = 160 << 20
MAX_ANSWER_S = 10.0
U64 = 2**64 - 1
C = grpc.StatusCode


@dataclass
class Env:
    cluster: StorageCluster
    client: StorageClient
    info: mpb.RoutingInfo
    chain: mpb.Chain
    pid: int
    stub: storage_pb2_grpc.StorageServiceStub
    channel: grpc.aio.Channel


pytestmark = pytest.mark.asyncio(loop_scope="module")  # one cluster for the module's tests


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def env(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Env]:
    cluster = await start_cluster(Path(tmp_path_factory.mktemp("hostile")) / "cluster", targets_per_disk=1)
    mg = cluster.client()
    client = StorageClient(mg, CLUSTER_TOKEN, retry_deadline_s=20.0)
    try:
        info = await cluster.routing()
        chain = info.chains[0]
        head = chain.targets[0].node_id
        big = ChunkWrite(chain_id=chain.chain_id, inode_id=9, chunk_index=0, data=os.urandom(BIG), chunk_size=BIG)
        assert (await client.batch_write([big]))[0].ok
        channel = open_channel(_grpc_address(info, head))
        proc = cluster.nodes[head - 101].proc
        assert proc is not None
        env = Env(cluster, client, info, chain, proc.pid, storage_pb2_grpc.StorageServiceStub(channel), channel)
        yield env
        await env.channel.close()
    finally:
        await client.close()
        await mg.close()
        cluster.stop()


@pytest_asyncio.fixture(autouse=True, loop_scope="module")
async def _current_routing(env: Env) -> None:
    """Each test against the chain as it is now (a loaded machine may have moved the head meanwhile)."""
    info = await env.cluster.wait_all_serving()
    chain = next(c for c in info.chains if c.chain_id == env.chain.chain_id)
    head = chain.targets[0].node_id
    if head != env.chain.targets[0].node_id:
        await env.channel.close()
        env.channel = open_channel(_grpc_address(info, head))
        env.stub = storage_pb2_grpc.StorageServiceStub(env.channel)
        proc = env.cluster.nodes[head - 101].proc
        assert proc is not None
        env.pid = proc.pid
    env.info, env.chain = info, chain


def _grpc_address(info: mpb.RoutingInfo, node_id: int) -> str:
    return next(e.address for n in info.nodes if n.node_id == node_id for e in n.endpoints if e.name == "grpc")


def _cid(inode: int = 9, index: int = 0) -> spb.ChunkId:
    return spb.ChunkId(inode_id=inode, chunk_index=index)


def _read(e: Env, **kw: Any) -> spb.ReadIO:
    fields: dict[str, Any] = {
        "chain_id": e.chain.chain_id,
        "chain_version": e.chain.version,
        "chunk_id": _cid(),
        "length_bytes": 4096,
        **kw,
    }
    return spb.ReadIO(**fields)


def _write(e: Env, data: bytes = b"hostile", **kw: Any) -> spb.WriteIO:
    fields: dict[str, Any] = {
        "chain_id": e.chain.chain_id,
        "chain_version": e.chain.version,
        "chunk_id": _cid(31),
        "chunk_size_bytes": 4096,
        "length_bytes": len(data),
        "checksum": spb.Checksum(type=1, value=crc32c_of(data)),
        "inline_data": data,
        **kw,
    }
    return spb.WriteIO(**fields)


def _update(e: Env, **kw: Any) -> spb.ChunkUpdate:
    data = b"forwarded"
    fields: dict[str, Any] = {
        "chain_id": e.chain.chain_id,
        "chain_version": e.chain.version,
        "chunk_id": _cid(32),
        "update_type": spb.UPDATE_TYPE_WRITE,
        "update_version": 1,
        "chunk_size_bytes": 4096,
        "length_bytes": len(data),
        "checksum": spb.Checksum(type=1, value=crc32c_of(data)),
        "inline_data": data,
        **kw,
    }
    return spb.ChunkUpdate(**fields)


Build = Callable[[Env], tuple[str, Any]]
CASES: dict[str, tuple[Build, C]] = {
    # BatchRead: the 434-byte request (the same 16 MiB chunk 24 times), totals, counts, ranges, ids
    "read: one 16 MiB chunk asked 24 times": (
        lambda e: (
            "BatchRead",
            spb.BatchReadRequest(ios=[_read(e, length_bytes=BIG)] * 24, transport=spb.DATA_TRANSPORT_INLINE),
        ),
        C.INVALID_ARGUMENT,
    ),
    "read: 24 x 16 MiB inline, each range different": (
        lambda e: (
            "BatchRead",
            spb.BatchReadRequest(
                ios=[_read(e, offset_bytes=i, length_bytes=BIG - i) for i in range(24)],
                transport=spb.DATA_TRANSPORT_INLINE,
            ),
        ),
        C.RESOURCE_EXHAUSTED,
    ),
    "read: 17 x 16 MiB staged in bulk": (
        lambda e: (
            "BatchRead",
            spb.BatchReadRequest(
                ios=[_read(e, offset_bytes=i, length_bytes=BIG - i) for i in range(17)],
                transport=spb.DATA_TRANSPORT_BULK,
            ),
        ),
        C.RESOURCE_EXHAUSTED,
    ),
    "read: 5,000 IOs": (
        lambda e: (
            "BatchRead",
            spb.BatchReadRequest(ios=[_read(e, offset_bytes=i, length_bytes=1) for i in range(5000)]),
        ),
        C.RESOURCE_EXHAUSTED,
    ),
    "read: length 0": (
        lambda e: ("BatchRead", spb.BatchReadRequest(ios=[_read(e, length_bytes=0)])),
        C.INVALID_ARGUMENT,
    ),
    "read: length 2^64-1": (
        lambda e: ("BatchRead", spb.BatchReadRequest(ios=[_read(e, length_bytes=U64)])),
        C.INVALID_ARGUMENT,
    ),
    "read: offset 2^64-1": (
        lambda e: ("BatchRead", spb.BatchReadRequest(ios=[_read(e, offset_bytes=U64)])),
        C.INVALID_ARGUMENT,
    ),
    "read: inode 0": (
        lambda e: ("BatchRead", spb.BatchReadRequest(ios=[_read(e, chunk_id=_cid(0))])),
        C.INVALID_ARGUMENT,
    ),
    "read: inode 2^64-1": (
        lambda e: ("BatchRead", spb.BatchReadRequest(ios=[_read(e, chunk_id=_cid(U64))])),
        C.INVALID_ARGUMENT,
    ),
    "read: chunk index 2^64-1": (
        lambda e: ("BatchRead", spb.BatchReadRequest(ios=[_read(e, chunk_id=_cid(9, U64))])),
        C.INVALID_ARGUMENT,
    ),
    "read: unknown transport": (
        lambda e: ("BatchRead", spb.BatchReadRequest(ios=[_read(e)], transport=99)),  # type: ignore[arg-type]
        C.INVALID_ARGUMENT,
    ),
    # BatchWrite
    "write: 5,000 IOs": (
        lambda e: ("BatchWrite", spb.BatchWriteRequest(ios=[_write(e)] * 5000)),
        C.RESOURCE_EXHAUSTED,
    ),
    "write: 17 x 16 MiB named, none sent": (
        lambda e: (
            "BatchWrite",
            spb.BatchWriteRequest(
                ios=[
                    _write(
                        e,
                        chunk_id=_cid(31, i),
                        chunk_size_bytes=BIG,
                        length_bytes=BIG,
                        transfer=spb.TransferRef(transfer_id="never-pushed"),
                    )
                    for i in range(17)
                ]
            ),
        ),
        C.RESOURCE_EXHAUSTED,
    ),
    "write: chunk size 0": (
        lambda e: ("BatchWrite", spb.BatchWriteRequest(ios=[_write(e, chunk_size_bytes=0)])),
        C.INVALID_ARGUMENT,
    ),
    "write: chunk size 2^64-1": (
        lambda e: ("BatchWrite", spb.BatchWriteRequest(ios=[_write(e, chunk_size_bytes=U64)])),
        C.INVALID_ARGUMENT,
    ),
    "write: offset 2^64-1": (
        lambda e: ("BatchWrite", spb.BatchWriteRequest(ios=[_write(e, offset_bytes=U64)])),
        C.INVALID_ARGUMENT,
    ),
    "write: no data": (
        lambda e: (
            "BatchWrite",
            spb.BatchWriteRequest(
                ios=[
                    spb.WriteIO(
                        chain_id=e.chain.chain_id,
                        chain_version=e.chain.version,
                        chunk_id=_cid(31),
                        chunk_size_bytes=4096,
                        length_bytes=10,
                    )
                ]
            ),
        ),
        C.INVALID_ARGUMENT,
    ),
    "write: update id with a 100-byte client id": (
        lambda e: (
            "BatchWrite",
            spb.BatchWriteRequest(ios=[_write(e, update_id=spb.UpdateId(client_id=b"x" * 100, request_id=1))]),
        ),
        C.INVALID_ARGUMENT,
    ),
    "write: update id with request id 0": (
        lambda e: ("BatchWrite", spb.BatchWriteRequest(ios=[_write(e, update_id=spb.UpdateId(client_id=b"c"))])),
        C.INVALID_ARGUMENT,
    ),
    "write: unknown chain": (
        lambda e: ("BatchWrite", spb.BatchWriteRequest(ios=[_write(e, chain_id=9999)])),
        C.INVALID_ARGUMENT,
    ),
    # ForwardUpdates (chain internal; the cluster token may send it, but not nonsense)
    "forward: update type unspecified, chunk size 0": (
        lambda e: (
            "ForwardUpdates",
            spb.ForwardUpdatesRequest(
                updates=[
                    _update(
                        e, update_type=spb.UPDATE_TYPE_UNSPECIFIED, chunk_size_bytes=0, length_bytes=0, inline_data=b""
                    )
                ]
            ),
        ),
        C.INVALID_ARGUMENT,
    ),
    "forward: write with chunk size 0": (
        lambda e: ("ForwardUpdates", spb.ForwardUpdatesRequest(updates=[_update(e, chunk_size_bytes=0)])),
        C.INVALID_ARGUMENT,
    ),
    "forward: version 0": (
        lambda e: ("ForwardUpdates", spb.ForwardUpdatesRequest(updates=[_update(e, update_version=0)])),
        C.INVALID_ARGUMENT,
    ),
    "forward: 5,000 updates": (
        lambda e: ("ForwardUpdates", spb.ForwardUpdatesRequest(updates=[_update(e)] * 5000)),
        C.RESOURCE_EXHAUSTED,
    ),
    "forward: 5,000 remembered updates": (
        lambda e: (
            "ForwardUpdates",
            spb.ForwardUpdatesRequest(
                updates=[
                    _update(
                        e,
                        full_chunk_replace=True,
                        recent_updates=[
                            spb.UpdateRecord(update_id=spb.UpdateId(client_id=b"c", request_id=i + 1), version=1)
                            for i in range(5000)
                        ],
                    )
                ]
            ),
        ),
        C.RESOURCE_EXHAUSTED,
    ),
    # the rest of the service
    "truncate: chunk size 0": (
        lambda e: (
            "TruncateChunks",
            spb.TruncateChunksRequest(
                ios=[spb.TruncateIO(chain_id=e.chain.chain_id, chain_version=e.chain.version, chunk_id=_cid(33))]
            ),
        ),
        C.INVALID_ARGUMENT,
    ),
    "truncate: length past the chunk": (
        lambda e: (
            "TruncateChunks",
            spb.TruncateChunksRequest(
                ios=[
                    spb.TruncateIO(
                        chain_id=e.chain.chain_id,
                        chain_version=e.chain.version,
                        chunk_id=_cid(33),
                        chunk_size_bytes=4096,
                        length_bytes=U64,
                    )
                ]
            ),
        ),
        C.INVALID_ARGUMENT,
    ),
    "truncate: 5,000 IOs": (
        lambda e: (
            "TruncateChunks",
            spb.TruncateChunksRequest(
                ios=[
                    spb.TruncateIO(
                        chain_id=e.chain.chain_id,
                        chain_version=e.chain.version,
                        chunk_id=_cid(33),
                        chunk_size_bytes=4096,
                    )
                ]
                * 5000
            ),
        ),
        C.RESOURCE_EXHAUSTED,
    ),
    "remove: inode 0": (
        lambda e: ("RemoveChunks", spb.RemoveChunksRequest(chain_id=e.chain.chain_id, chain_version=e.chain.version)),
        C.INVALID_ARGUMENT,
    ),
    "remove: unknown chain": (
        lambda e: ("RemoveChunks", spb.RemoveChunksRequest(chain_id=9999, inode_id=34)),
        C.INVALID_ARGUMENT,
    ),
    "remove: a stale chain version": (  # not bad input: the caller's routing is old; retry after a fresh one
        lambda e: (
            "RemoveChunks",
            spb.RemoveChunksRequest(chain_id=e.chain.chain_id, chain_version=e.chain.version + 7, inode_id=34),
        ),
        C.UNAVAILABLE,
    ),
    "query last: 5,000 queries": (
        lambda e: (
            "QueryLastChunk",
            spb.QueryLastChunkRequest(
                queries=[spb.LastChunkQuery(chain_id=e.chain.chain_id, chain_version=e.chain.version, inode_id=9)]
                * 5000
            ),
        ),
        C.RESOURCE_EXHAUSTED,
    ),
    "query last: inode 0": (
        lambda e: (
            "QueryLastChunk",
            spb.QueryLastChunkRequest(queries=[spb.LastChunkQuery(chain_id=e.chain.chain_id)]),
        ),
        C.INVALID_ARGUMENT,
    ),
    "repair: the same chunk twice": (
        lambda e: (
            "RepairChunks",
            spb.RepairChunksRequest(chain_id=e.chain.chain_id, chain_version=e.chain.version, chunk_ids=[_cid(9)] * 2),
        ),
        C.INVALID_ARGUMENT,
    ),
    "repair: 5,000 chunks": (
        lambda e: (
            "RepairChunks",
            spb.RepairChunksRequest(
                chain_id=e.chain.chain_id, chain_version=e.chain.version, chunk_ids=[_cid(9, i) for i in range(5000)]
            ),
        ),
        C.RESOURCE_EXHAUSTED,
    ),
    "repair: unknown chain": (
        lambda e: ("RepairChunks", spb.RepairChunksRequest(chain_id=9999)),
        C.INVALID_ARGUMENT,
    ),
    "complete sync: unknown target": (lambda e: ("CompleteSync", spb.CompleteSyncRequest(target_id=U64)), C.NOT_FOUND),
    "complete sync: a target that is not syncing": (
        lambda e: ("CompleteSync", spb.CompleteSyncRequest(target_id=e.chain.targets[0].target_id)),
        C.INVALID_ARGUMENT,
    ),
    "create target: id 0": (lambda e: ("CreateTarget", spb.CreateTargetRequest(chain_id=1)), C.INVALID_ARGUMENT),
    "create target: disk 2^32-1": (
        lambda e: ("CreateTarget", spb.CreateTargetRequest(target_id=77, chain_id=77, disk_index=2**32 - 1)),
        C.INVALID_ARGUMENT,
    ),
    "offline target: unknown": (lambda e: ("OfflineTarget", spb.OfflineTargetRequest(target_id=U64)), C.NOT_FOUND),
}
STREAMS: dict[str, tuple[Build, C]] = {
    "dump chunk meta: unknown target": (
        lambda e: ("DumpChunkMeta", spb.DumpChunkMetaRequest(target_id=U64)),
        C.NOT_FOUND,
    ),
    "grant transfer: unknown transfer": (
        lambda e: ("GrantTransfer", spb.GrantTransferRequest(transfer_id="f" * 32)),
        C.NOT_FOUND,
    ),
}


def _peak_reset(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # resets VmHWM (peak RSS) to the current RSS


async def _still_serves(e: Env, n: int) -> None:
    data = os.urandom(8192)
    io = ChunkWrite(chain_id=e.chain.chain_id, inode_id=60, chunk_index=n, data=data, chunk_size=8192)
    assert (await e.client.batch_write([io]))[0].ok
    got = (await e.client.batch_read([ChunkRead(chain_id=e.chain.chain_id, inode_id=60, chunk_index=n, length=8192)]))[
        0
    ]
    assert got.ok and bytes(got.data) == data


async def _bounded(e: Env, name: str, call: Callable[[], Any]) -> RpcError | DataRefused | None:
    """Run ``call``; its refusal (None: it succeeded); asserts the time and the peak memory it cost the node."""
    _peak_reset(e.pid)
    before = rss_kib(e.pid) * 1024
    began = time.monotonic()
    refusal: RpcError | DataRefused | None = None
    try:
        await call()
    except (RpcError, DataRefused) as exc:
        refusal = exc
    elapsed = time.monotonic() - began
    peak = peak_rss_kib(e.pid) * 1024
    assert elapsed < MAX_ANSWER_S, f"{name}: {elapsed:.1f} s"
    assert peak - before < MAX_PEAK_GROWTH_BYTES, f"{name}: peak RSS grew {(peak - before) >> 20} MiB"
    return refusal


def _code(refusal: RpcError | DataRefused | None) -> C | None:
    return refusal.code if isinstance(refusal, RpcError) else None


@pytest.mark.parametrize("name", list(CASES))
async def test_each_rpc_refuses_hostile_input_cheaply(env: Env, name: str) -> None:
    build, expected = CASES[name]
    method, request = build(env)
    rpc = RpcClient(token=CLUSTER_TOKEN, timeout_s=30.0)
    code = _code(await _bounded(env, name, lambda: rpc.unary(getattr(env.stub, method), request)))
    assert code is expected, f"{name}: {code}"
    await _still_serves(env, abs(hash(name)) % 1000)


@pytest.mark.parametrize("name", list(STREAMS))
async def test_each_stream_rpc_refuses_hostile_input(env: Env, name: str) -> None:
    build, expected = STREAMS[name]
    method, request = build(env)
    rpc = RpcClient(token=CLUSTER_TOKEN, timeout_s=30.0)

    async def drain() -> None:
        async for _ in rpc.stream(getattr(env.stub, method), request):
            pass

    assert _code(await _bounded(env, name, drain)) is expected
    await _still_serves(env, abs(hash(name)) % 1000)


async def test_read_stream_answers_a_hostile_request_and_goes_on(env: Env) -> None:
    bad = spb.ReadStreamRequest(request_id=1, read=spb.BatchReadRequest(ios=[_read(env, length_bytes=BIG)] * 24))
    good = spb.ReadStreamRequest(request_id=2, read=spb.BatchReadRequest(ios=[_read(env)]))

    async def requests() -> AsyncIterator[spb.ReadStreamRequest]:
        yield bad
        yield good

    metadata = RpcClient(token=CLUSTER_TOKEN).metadata()
    answers = {a.request_id: a async for a in env.stub.ReadStream(requests(), metadata=metadata, timeout=30)}
    assert answers[1].error_code == C.INVALID_ARGUMENT.value[0]
    assert answers[2].error_code == 0 and answers[2].read.results[0].status == spb.CHUNK_IO_STATUS_OK


async def test_nothing_was_written_by_the_refused_calls(env: Env) -> None:
    """Refused writes, forwards and truncates left no chunk behind on any replica."""
    for inode in (31, 32, 33):
        for target in env.chain.targets:
            got = (
                await env.client.batch_read(
                    [ChunkRead(chain_id=env.chain.chain_id, inode_id=inode, chunk_index=0, length=10)],
                    prefer_target=target.target_id,
                )
            )[0]
            assert got.status == spb.CHUNK_IO_STATUS_CHUNK_NOT_FOUND, (inode, target.target_id, got.status)


@pytest.mark.parametrize("method", ["BatchRead", "BatchWrite", "ForwardUpdates", "RepairChunks"])
async def test_malformed_bytes_are_an_invalid_argument(env: Env, method: str) -> None:
    for raw in MALFORMED_MESSAGES:
        answer = await call_raw(
            env.channel, f"/fireflyer.storage.v1.StorageService/{method}", [raw], token=CLUSTER_TOKEN
        )
        assert answer.code is C.INVALID_ARGUMENT, (method, raw, answer)
    await _still_serves(env, 999)


async def test_the_data_path_refuses_the_same_requests_cheaply(env: Env) -> None:
    """The data path's ``read`` and ``call`` run BatchRead's and BatchWrite's checks: the issue's request and
    an oversized write are refused on the connection, which stays open and serves a normal read."""
    head = env.chain.targets[0].node_id
    node = next(n for n in env.cluster.nodes if n.info["node_id"] == head)
    conn = DataConnection(str(node.info["data"]), CLUSTER_TOKEN, "another-host")
    hostile_read = spb.BatchReadRequest(ios=[_read(env, length_bytes=BIG)] * 24, transport=spb.DATA_TRANSPORT_BULK)
    too_much = spb.BatchReadRequest(
        ios=[_read(env, offset_bytes=i, length_bytes=BIG - i) for i in range(17)], transport=spb.DATA_TRANSPORT_BULK
    )
    too_many = spb.BatchWriteRequest(ios=[_write(env)] * 5000)
    try:
        for request, expected in ((hostile_read, "INVALID_ARGUMENT"), (too_much, "RESOURCE_EXHAUSTED")):

            async def read(request: spb.BatchReadRequest = request) -> None:
                await conn.read(request.SerializeToString(), lambda raw: [])

            refusal = await _bounded(env, expected, read)
            assert isinstance(refusal, DataRefused) and refusal.code == expected, refusal
        with pytest.raises(DataRefused) as err:
            await conn.call("BatchWrite", too_many.SerializeToString(), "", [])
        assert err.value.code == "RESOURCE_EXHAUSTED", err.value
        one = spb.BatchReadRequest(ios=[_read(env)], transport=spb.DATA_TRANSPORT_BULK)
        sink = memoryview(bytearray(4096))
        raw, _ = await conn.read(one.SerializeToString(), lambda raw: [sink])
        assert spb.BatchReadResponse.FromString(raw).results[0].status == spb.CHUNK_IO_STATUS_OK
    finally:
        conn.close()


async def test_a_read_stream_whose_caller_takes_no_answer_holds_bounded_memory(env: Env) -> None:
    """A caller sends 20 reads of the 16 MiB chunk on one ReadStream and takes no answer for a while: the node
    reads ahead only a bounded part of what the stream asked for (it held every answer before: 320 MiB, and
    more with more requests), and the stream then delivers every answer."""
    many = [
        spb.ReadStreamRequest(request_id=n, read=spb.BatchReadRequest(ios=[_read(env, length_bytes=BIG)]))
        for n in range(20)
    ]

    async def requests() -> AsyncIterator[spb.ReadStreamRequest]:
        for request in many:
            yield request

    _peak_reset(env.pid)
    before = rss_kib(env.pid) * 1024
    metadata = RpcClient(token=CLUSTER_TOKEN).metadata()
    call = env.stub.ReadStream(requests(), metadata=metadata, timeout=120)
    growth = 0
    for _ in range(40):  # 8 s for the node to do what it will with the stream meanwhile (no answer taken)
        await asyncio.sleep(0.2)
        growth = peak_rss_kib(env.pid) * 1024 - before
        if growth >= MAX_PEAK_GROWTH_BYTES:
            break
    assert growth < MAX_PEAK_GROWTH_BYTES, f"peak RSS grew {growth >> 20} MiB"
    answers = [a async for a in call]
    assert sorted(a.request_id for a in answers) == list(range(20))
    failed = [
        (a.request_id, a.error_message, a.read.results[0].status if a.read.results else None)
        for a in answers
        if a.error_code or a.read.results[0].status != spb.CHUNK_IO_STATUS_OK
    ]
    assert not failed, failed


@pytest.mark.parametrize(
    "body",
    [b"{not json", b"\xff\xfe{}", b"[1, 2]", b'{"a": ' + b"[" * 5000 + b"]" * 5000 + b"}"],
    ids=["bad-json", "not-utf8", "not-an-object", "nested-5000"],
)
async def test_a_malformed_data_path_header_closes_the_connection_quietly(env: Env, body: bytes) -> None:
    """A frame header that is not a JSON object (before and after the handshake) closes the connection as a bad
    header, with no error traceback in the node's log per connection (a hostile client could flood the log),
    and the node serves on."""
    head = env.chain.targets[0].node_id
    node = next(n for n in env.cluster.nodes if n.info["node_id"] == head)
    host, port = str(node.info["data"]).rsplit(":", 1)
    log = env.cluster.folder / f"{node.name}.log"
    logged = log.stat().st_size
    hello = json.dumps({"op": "auth", "token": CLUSTER_TOKEN, "version": DATA_PATH_VERSION}).encode()
    for prefix in (b"", struct.pack(">I", len(hello)) + hello):
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            writer.write(prefix + struct.pack(">I", len(body)) + body)
            await writer.drain()
            got = await asyncio.wait_for(reader.read(), MAX_ANSWER_S)  # the handshake's answer, then the end
            assert prefix or got == b""
        finally:
            writer.close()
    await _still_serves(env, 998)
    assert b"Traceback" not in log.read_bytes()[logged:]


async def test_an_inline_read_just_under_the_inline_limit_gets_its_answer(env: Env) -> None:
    """Inline reads that ask for just under the node's inline limit in all are answered: the limit leaves the
    answer room under gRPC's message cap (at 64 MiB, the answer was read, then too large to send)."""
    limit = StorageSettings.model_fields["max_inline_read_bytes"].default
    count = -(-limit // BIG)  # IOs of at most BIG bytes (distinct ranges) that add up to just under the limit
    each = limit // count - count
    ios = [_read(env, offset_bytes=n, length_bytes=each) for n in range(count)]
    rpc = RpcClient(token=CLUSTER_TOKEN, timeout_s=60.0)
    answer = await rpc.unary(env.stub.BatchRead, spb.BatchReadRequest(ios=ios, transport=spb.DATA_TRANSPORT_INLINE))
    assert [(r.status, len(r.inline_data)) for r in answer.results] == [(spb.CHUNK_IO_STATUS_OK, each)] * count
