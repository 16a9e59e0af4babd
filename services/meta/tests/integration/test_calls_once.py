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
from ff_rpc import RpcError, client, once
from fireflyer.meta.v1 import meta_pb2 as pb

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
    meta = fs._meta
    grpc_address = meta.current_address
    fast = meta._fast_of[grpc_address]
    loser = AnswerLoser(fast)
    meta._fast_of[grpc_address] = fs._run(loser.start())
    try:
        # Before calls were done once, the client could not send this Rename again (it may have run) and raised;
        # sent again without the key, it would have found its source gone (NOT_FOUND).
        assert rename(fs, f"{home}/a", f"{home}/b") == moved
    finally:
        meta._fast_of[grpc_address] = fast
        fs._run(loser.close())
    assert loser.lost == 1, "the proxy did not lose the first answer"
    assert not fs.exists(f"{home}/a") and fs.stat(f"{home}/b").inode_id == moved
