"""Which updates are prepared in a worker thread: those whose new content is made from the stored chunk."""

from __future__ import annotations

import pytest

from ff_storage.node_state import Update
from ff_storage.writes import _reads_stored
from fireflyer.storage.v1 import storage_pb2 as spb

SIZE = 4096


@pytest.mark.parametrize(
    ("update", "reads"),
    [
        (Update(key=(1, 0), kind=spb.UPDATE_TYPE_WRITE, chunk_size=SIZE, offset=0, length=SIZE), False),
        (Update(key=(1, 0), kind=spb.UPDATE_TYPE_WRITE, chunk_size=SIZE, offset=0, length=SIZE - 1), True),
        (Update(key=(1, 0), kind=spb.UPDATE_TYPE_WRITE, chunk_size=SIZE, offset=1, length=SIZE - 1), True),
        (Update(key=(1, 0), kind=spb.UPDATE_TYPE_WRITE, chunk_size=2 * SIZE, offset=0, length=SIZE), True),
        (Update(key=(1, 0), kind=spb.UPDATE_TYPE_WRITE, chunk_size=SIZE, offset=10, length=5, full=True), False),
        (Update(key=(1, 0), kind=spb.UPDATE_TYPE_TRUNCATE, chunk_size=SIZE, length=SIZE), True),
        (Update(key=(1, 0), kind=spb.UPDATE_TYPE_REMOVE, chunk_size=0), False),
    ],
    ids=[
        "whole write",
        "short write",
        "write at offset",
        "write of a part of a larger chunk",
        "full replace",
        "truncate",
        "remove",
    ],
)
def test_only_updates_built_on_the_stored_chunk_read_it(update: Update, reads: bool) -> None:
    assert _reads_stored(update) is reads
