"""A head and its successor in one process, the forward wire faked: a write whose acknowledgement was lost, retried
in a merged run with another write of the chunk, must leave the successor with the head's bytes."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from ff_fsprotocol.checksum import crc32c_of
from ff_fsprotocol.routing import Chain, RoutingView
from ff_fsprotocol.routing import Target as RoutingTarget
from ff_storage.core.chunks import ChunkKey
from ff_storage.core.requests import ChunkUpdate, UpdateKind
from ff_storage.core.results import IoStatus, UpdateResult
from ff_storage.dataserver import TransferBoxes
from ff_storage.node import StorageNode
from ff_storage.node_state import NodeConfig, Update
from fireflyer.mgmtd.v1 import mgmtd_pb2 as mpb

from .conftest import NodeConfigOf

KEY: ChunkKey = (5, 0)
CHUNK = 4096


def _routing() -> RoutingView:
    """Chain 1 at version 1: target 1 on node 101 (head), then target 2 on node 102 (tail), both serving."""
    targets = [
        mpb.Target(target_id=t, node_id=100 + t, public_state=mpb.PUBLIC_TARGET_STATE_SERVING, chain_id=1)
        for t in (1, 2)
    ]
    return RoutingView(mpb.RoutingInfo(version=1, chains=[mpb.Chain(chain_id=1, version=1, targets=targets)]))


@pytest.fixture
def chain(node_config: NodeConfigOf, tmp_path: Path) -> Iterator[tuple[StorageNode, StorageNode]]:
    nodes = []
    for t in (1, 2):
        config: NodeConfig = dataclasses.replace(
            node_config(100 + t, fsync=False),
            disks=[tmp_path / f"node{t}"],
            targets_file=tmp_path / f"targets{t}.json",
            forward_timeout_s=0.3,  # a lost answer fails the head's update soon
        )
        (tmp_path / f"node{t}").mkdir()
        node = StorageNode(config, TransferBoxes())
        node.state.create_target(t, 1, 0)
        node.state.on_routing(_routing())
        node.state.targets[t].role.sync_done(1)
        nodes.append(node)
    try:
        yield nodes[0], nodes[1]
    finally:
        for node in nodes:
            node.close()


def _wire(head: StorageNode, tail: StorageNode, mode: list[str]) -> None:
    """The head's forwards reach the tail as ``peers.send_updates`` builds them. ``mode[0]``: "up"; "lose" (the next
    call reaches the tail, its answer is lost, and the calls after it fail: "down"); "down" (nothing reaches it)."""

    async def send_updates(
        chain: Chain, nxt: RoutingTarget, updates: list[Update], full_keys: set[ChunkKey], from_target: int, **_: object
    ) -> list[UpdateResult]:
        if mode[0] == "down":
            raise ConnectionError("the tail is unreachable")
        msgs = []
        for u in updates:
            full = u.full or u.key in full_keys
            payload = (u.content or b"") if full else u.data
            records = u.records if u.records is not None else head.state.targets[1].engine.recent_updates(u.key)
            msgs.append(
                ChunkUpdate(
                    chain_id=chain.chain_id,
                    chain_version=chain.version,
                    key=u.key,
                    kind=u.kind,
                    version=u.version,
                    chunk_size=u.chunk_size,
                    offset=0 if full else u.offset,
                    length=len(payload),
                    checksum=crc32c_of(payload),
                    data=payload,
                    full=full,
                    update_id=u.update_id,
                    records=tuple(records if full or u.records is not None else ()),
                )
            )
        answers = await tail.writer.forward_updates(msgs, "")
        if mode[0] == "lose":
            mode[0] = "down"
            raise ConnectionError("the answer was lost")
        return answers

    head.peers.send_updates = send_updates  # type: ignore[method-assign]


def _write(offset: int, data: bytes, request_id: int) -> Update:
    return Update(
        key=KEY,
        kind=UpdateKind.WRITE,
        chunk_size=CHUNK,
        offset=offset,
        data=data,
        data_checksum=crc32c_of(data),
        length=len(data),
        update_id=(b"client-a" * 2, request_id),
    )


async def _lost_then_retried(chain: tuple[StorageNode, StorageNode], first: list[Update], retry: list[Update]) -> bytes:
    """A first version of the chunk; then ``first``, which the tail commits as version 2 and whose answer is lost (the
    head drops the version); then ``retry``. Every retried write succeeds and both hold the same version and bytes:
    those bytes."""
    head, tail = chain
    h, t = head.state.targets[1], tail.state.targets[2]
    mode = ["up"]
    _wire(head, tail, mode)
    base = _write(0, b"." * 300, 1)
    await head.writer._head_updates(h, [base])
    assert base.result.status == IoStatus.OK

    mode[0] = "lose"
    await head.writer._head_updates(h, first)
    assert [u.result.status for u in first] == [IoStatus.FORWARD_FAILED] * len(first)
    assert t.engine.get(KEY).committed_version == 2  # type: ignore[union-attr]  # the tail took it
    assert h.engine.get(KEY).committed_version == 1  # type: ignore[union-attr]  # the head did not

    mode[0] = "up"
    await head.writer._head_updates(h, retry)
    assert [u.result.status for u in retry] == [IoStatus.OK] * len(retry)
    at_head = h.engine.read_committed(KEY)
    at_tail = t.engine.read_committed(KEY)
    assert at_head is not None and at_tail is not None
    assert (at_tail[0].committed_version, at_tail[1]) == (at_head[0].committed_version, at_head[1])
    return bytes(at_head[1])


async def test_a_write_retried_in_a_merged_run_leaves_the_successor_with_the_heads_bytes(
    chain: tuple[StorageNode, StorageNode],
) -> None:
    """Write A went alone (write C of the same chunk was in another call of the client's, which failed before
    reaching the head); the tail committed A as version 2, its answer was lost, the head dropped the version. The
    client retries A and C in one call: the head merges them into one version 2 under A's id. The tail must not take
    that for the version it has (a duplicate: it kept bytes without C, which the head acknowledged)."""
    first = [_write(0, b"a" * 10, 2)]
    content = await _lost_then_retried(chain, first, [_write(0, b"a" * 10, 2), _write(200, b"c" * 10, 4)])
    assert content[:10] == b"a" * 10 and content[200:210] == b"c" * 10


async def test_a_merged_runs_write_retried_alone_leaves_the_successor_with_the_heads_bytes(
    chain: tuple[StorageNode, StorageNode],
) -> None:
    """The mirror case: writes A and C went in one merged run (version 2 under A's id), the tail committed it, its
    answer was lost, the head dropped the version. The client retries C alone (A's retry is in another call, not yet
    at the head): the head makes version 2 of C only. The tail holds C's record at version 2 too, but made with A's
    bytes: it must not answer "duplicate" and keep them."""
    first = [_write(0, b"a" * 10, 2), _write(200, b"c" * 10, 4)]
    content = await _lost_then_retried(chain, first, [_write(200, b"c" * 10, 4)])
    assert content[:10] == b"." * 10 and content[200:210] == b"c" * 10  # C alone


async def test_a_merged_run_sent_again_whole_leaves_both_with_its_bytes(
    chain: tuple[StorageNode, StorageNode],
) -> None:
    """The run [A, C] committed at the tail, its answer lost, is retried as the same run: both end with its bytes."""
    first = [_write(0, b"a" * 10, 2), _write(200, b"c" * 10, 4)]
    content = await _lost_then_retried(chain, first, [_write(0, b"a" * 10, 2), _write(200, b"c" * 10, 4)])
    assert content[:10] == b"a" * 10 and content[200:210] == b"c" * 10
