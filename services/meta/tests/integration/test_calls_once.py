"""Meta's namespace changes done once, through the real client and service: a call whose answer was lost, sent
again with its key (as the client's retry sends it), answers its first result; the key is the caller's own."""

from __future__ import annotations

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
