"""Meta's namespace changes done once, through the real client and service: a call whose answer was lost is retried
with its key and answers its first result (nothing applied twice); the key is the caller's own."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

import hf3fs
from ff_cluster import MgmtdClient
from ff_fsprotocol.meta_once import ONCE_TAG, ONCE_TAG_VALUE
from ff_rpc import RpcError, client, once
from ff_testing.process import CLUSTER_TOKEN
from fireflyer.common.v1 import common_pb2
from fireflyer.meta.v1 import meta_pb2 as pb
from fireflyer.mgmtd.v1 import mgmtd_pb2 as mpb

from .conftest import MetaCluster

KEY = "0123456789abcdef0123456789abcdef"


def _fixed_key(monkeypatch: pytest.MonkeyPatch, key: str) -> None:
    """Every call the clients make carries ``key``, as every attempt of one call does."""

    @contextlib.contextmanager
    def sending_once() -> Iterator[str]:
        token = once._once.set(key)
        try:
            yield key
        finally:
            once._once.reset(token)

    monkeypatch.setattr(client, "sending_once", sending_once)


def rename(fs: hf3fs.FileSystem, src: str, dst: str) -> Any:
    """The inode id moved, or the status code the call failed with."""
    request = pb.RenameRequest(src_path=pb.PathAt(path=src), dst_path=pb.PathAt(path=dst))
    try:
        return fs._run(fs._meta.call(lambda m: m.rename, request)).inode.inode_id
    except RpcError as err:
        return err.code


def test_a_rename_sent_again_with_its_key_answers_its_first_result(
    cluster: MetaCluster, fs: hf3fs.FileSystem, home: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    fs.mkdir(f"{home}/a")
    first = fs.stat(f"{home}/a").inode_id
    _fixed_key(monkeypatch, KEY)
    assert rename(fs, f"{home}/a", f"{home}/b") == first
    fs.mkdir(f"{home}/a")  # made after the rename, whose answer the client did not get
    assert rename(fs, f"{home}/a", f"{home}/b") == first  # the retry: answered, nothing moved
    assert fs.exists(f"{home}/a") and fs.stat(f"{home}/b").inode_id == first
    with cluster.connect("bob") as bob:  # the same key from another user is not alice's call
        assert rename(bob, f"{home}/a", f"{home}/c") == grpc.StatusCode.PERMISSION_DENIED
    assert fs.exists(f"{home}/a") and not fs.exists(f"{home}/c")


def test_a_malformed_key_is_refused_and_changes_nothing(
    fs: hf3fs.FileSystem, home: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    fs.mkdir(f"{home}/a")
    _fixed_key(monkeypatch, "not a key!")
    assert rename(fs, f"{home}/a", f"{home}/b") == grpc.StatusCode.INVALID_ARGUMENT
    monkeypatch.undo()
    assert fs.exists(f"{home}/a") and not fs.exists(f"{home}/b")


class AnswerLoser:
    """A TCP proxy to meta's fast endpoint that loses one answer: the first bytes the server sends back are not passed
    on, and that connection is cut (as when meta's host or the network fails after meta committed a call)."""

    def __init__(self, target: str) -> None:
        self.host, port = target.rsplit(":", 1)
        self.port = int(port)
        self.lost = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection(self.host, self.port)

        async def up() -> None:
            while data := await client_r.read(1 << 16):
                server_w.write(data)
                await server_w.drain()
            server_w.close()

        async def down() -> None:
            while data := await server_r.read(1 << 16):
                if not self.lost:
                    self.lost += 1
                    client_w.transport.abort()
                    server_w.close()
                    return
                client_w.write(data)
                await client_w.drain()
            client_w.close()

        await asyncio.gather(up(), down(), return_exceptions=True)


def test_a_rename_whose_answer_is_lost_is_retried_and_applied_once(fs: hf3fs.FileSystem, home: str) -> None:
    fs.mkdir(f"{home}/a")
    moved = fs.stat(f"{home}/a").inode_id
    # Before calls were done once, the client could not send this Rename again (it may have run) and raised; sent
    # again without the key, it would have found its source gone (NOT_FOUND).
    outcome, lost = lose_one_answer(fs, lambda: rename(fs, f"{home}/a", f"{home}/b"))
    assert outcome == moved
    assert lost == 1, "the proxy did not lose the first answer"
    assert not fs.exists(f"{home}/a") and fs.stat(f"{home}/b").inode_id == moved


def lose_one_answer(fs: hf3fs.FileSystem, call: Any) -> tuple[Any, int]:
    """``call()``'s outcome with the first answer of meta's fast endpoint lost (``AnswerLoser``), and answers lost."""
    meta = fs._meta
    fs._run(meta.refresh())  # a new client has not asked mgmtd where meta is yet
    grpc_address = meta.current_address
    fast = meta._fast_of[grpc_address]
    loser = AnswerLoser(fast)
    meta._fast_of[grpc_address] = fs._run(loser.start())
    try:
        return call(), loser.lost
    finally:
        meta._fast_of[grpc_address] = fast
        fs._run(loser.close())


async def _register_untagged_meta(cluster: MetaCluster) -> int:
    """A META node registered as a meta instance from before calls were done once registers: the running instance's
    endpoints, without the tag. Its id."""
    mgmtd = MgmtdClient([cluster.mgmtd], token=CLUSTER_TOKEN)
    try:
        routing = (await mgmtd.mgmtd.get_routing_info(mpb.GetRoutingInfoRequest())).routing_info
        [real] = [n for n in routing.nodes if n.node_type == common_pb2.NODE_TYPE_META and n.enabled]
        assert real.tags.get(ONCE_TAG) == ONCE_TAG_VALUE, "meta does not say it does calls once"
        request = mpb.RegisterNodeRequest(node_type=common_pb2.NODE_TYPE_META, hostname="older-meta")
        request.endpoints.extend(real.endpoints)
        return (await mgmtd.mgmtd.register_node(request)).node_id
    finally:
        await mgmtd.close()


async def _disable(cluster: MetaCluster, node_id: int) -> None:
    mgmtd = MgmtdClient([cluster.mgmtd], token=cluster.tokens["root"])
    try:
        await mgmtd.mgmtd.set_node_enabled(mpb.SetNodeEnabledRequest(node_id=node_id, enabled=False))
    finally:
        await mgmtd.close()


def test_no_retry_while_a_meta_instance_does_not_say_it_does_calls_once(cluster: MetaCluster, home: str) -> None:
    """An older meta would run a retried Rename as a new one: while one is registered, the client does not retry
    (the caller sees the lost connection, as before calls were done once); once it is gone, it does again."""
    with cluster.connect("alice") as fs:
        fs.mkdir(f"{home}/a")
        moved = fs.stat(f"{home}/a").inode_id
    older = asyncio.run(_register_untagged_meta(cluster))
    try:
        with cluster.connect("alice") as fs:  # a client that starts now sees both registrations
            outcome, lost = lose_one_answer(fs, lambda: rename(fs, f"{home}/a", f"{home}/b"))
            assert lost == 1
            assert outcome == grpc.StatusCode.UNAVAILABLE  # not sent again: the move happened once
            assert not fs.exists(f"{home}/a") and fs.stat(f"{home}/b").inode_id == moved
    finally:
        asyncio.run(_disable(cluster, older))
    with cluster.connect("alice") as fs:
        fs.mkdir(f"{home}/a")
        again = fs.stat(f"{home}/a").inode_id
        outcome, lost = lose_one_answer(fs, lambda: rename(fs, f"{home}/a", f"{home}/c"))
        assert (outcome, lost) == (again, 1)  # retried with its key: the first answer
